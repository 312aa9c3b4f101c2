"""How ranks talk: the Communicator seam and its transports
(gRPC between processes, local threads)."""

from .base import Communicator, Request, check_array
from .errors import (
    CollectiveAborted,
    CollectiveError,
    CollectiveMismatch,
    CollectiveTimeout,
    RankFailure,
)
from .transports.local import LocalCommunicator, LocalWorld

__all__ = ["Communicator", "Request", "check_array", "LocalCommunicator", "LocalWorld",
           "CollectiveError", "CollectiveAborted", "CollectiveMismatch", "CollectiveTimeout",
           "RankFailure"]
