"""The gRPC transport: every rank a gRPC server, one persistent stream of frames to each peer.

    communicator.py   GrpcCommunicator: the rank's server, its links, and the Communicator over them
    link.py           PeerLink: one client stream to one peer (the `Link` of comm/contract.py)
"""

from .communicator import GrpcCommunicator

__all__ = ["GrpcCommunicator"]
