"""gRPC transport: every rank serves `Rank` on 127.0.0.1 and keeps one Exchange stream open
to each peer.

A send returns once its data is copied into the stream (as MPI's eager sends do), not when the peer
holds it: a per-message acknowledgement cost a third of the small-message latency here. A peer that
dies ends the stream, which fails every later send to it and every recv from it with RankFailure.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import time
import uuid
from concurrent import futures

import grpc
import numpy as np

from ...._proto import rank_pb2 as pb
from ...auth import RANK_KEY, TLS, TOKEN_KEY, TokenInterceptor
from ...base import Communicator, Request
from ...errors import CollectiveError
from ...mailbox import Message
from ...window import WindowsUnavailable
from ...wire import CHUNK_BYTES, MAX_MESSAGE_BYTES, Assembler, WireError
from .link import EXCHANGE, SERVICE, GrpcRequest, PeerLink  # noqa: F401 - re-exported

log = logging.getLogger("allreduce_edu")

SERVER_OPTIONS = [("grpc.so_reuseport", 0)]  # one port, one rank


def target(host: str, port: int) -> str:
    """HOST:PORT as gRPC dials and binds it: an IPv6 address in brackets ("[::1]:29500")."""
    bare = host.strip("[]")
    return f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}"


def host_identity() -> str:
    """Which machine this is, as shared memory sees it. On Linux the boot id and the network
    namespace (ranks in two namespaces reach neither each other's abstract Unix sockets nor each
    other's loopback); elsewhere the host's name and hardware address."""
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                boot = f.read().strip()
            return f"{boot}/{os.stat('/proc/self/ns/net').st_ino}"
        except OSError:  # no /proc mounted: as elsewhere
            pass
    return portable_host_identity()


def portable_host_identity() -> str:
    """The host's name and hardware address (uuid.getnode), as every system can tell them; the
    name alone where there is no hardware address (getnode then makes up a number per process)."""
    node = uuid.getnode()
    made_up = node >> 40 & 1  # the multicast bit: set on a random node, never on a real one
    return socket.gethostname() if made_up else f"{socket.gethostname()}/{node:012x}"


class GrpcCommunicator(Communicator):
    """A rank whose messages travel over gRPC between processes (or machines), or, given
    `nearby` (the shm transport: comm.transports.shm.ShmLinks), over shared memory to peers on
    this machine.

    `routes` is the peer -> link table its sends and receives read: a gRPC PeerLink
    (comm.grpc_link) to every peer, replaced by a ShmLink (comm.transports.shm) where `nearby`
    made one.
    """

    def __init__(self, rank: int, world_size: int, *, token: str, host: str = "127.0.0.1",
                 port: int = 0, timeout: float = 30.0, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 chunk_bytes: int = CHUNK_BYTES, tls: TLS | None = None, nearby=None):
        super().__init__(rank, world_size, timeout)
        if not token:
            raise ValueError("a gRPC rank needs the cluster's token: ranks refuse calls without it")
        self.tls, self.token = tls, token
        # a callable(JoinRequest, context) -> JoinReply on the rank that hosts one
        self.rendezvous = None
        self.metadata = ((TOKEN_KEY, token), (RANK_KEY, str(rank)))
        self.max_message_bytes, self.chunk_bytes = max_message_bytes, chunk_bytes
        self.closing = False
        self.streams: dict[int, PeerLink] = {}  # the gRPC link to every peer
        self.routes: dict = {}  # peer -> the link its messages take (gRPC, or shared memory)
        self.windows_opened = 0  # symmetric windows so far (comm.window)
        self.transport = "grpc" if nearby is None else "shm"
        # the server's threads: kept, so that close() ends them (grpc's stop() leaves them idle)
        self._serving = futures.ThreadPoolExecutor(max_workers=world_size + 8,
                                                   thread_name_prefix=f"rank{rank}-server")
        self._server = grpc.server(self._serving, interceptors=[TokenInterceptor(token)],
                                   options=SERVER_OPTIONS)
        self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {
            "Exchange": grpc.stream_unary_rpc_method_handler(
                self._serve_exchange, response_serializer=pb.ExchangeSummary.SerializeToString),
            "Ping": grpc.unary_unary_rpc_method_handler(
                self._serve_ping, pb.PingRequest.FromString, pb.PingReply.SerializeToString),
            "Join": grpc.unary_unary_rpc_method_handler(
                self._serve_join, pb.JoinRequest.FromString, pb.JoinReply.SerializeToString),
        })])
        bound = (self._server.add_secure_port(target(host, port), tls.server_credentials()) if tls
                 else self._server.add_insecure_port(target(host, port)))
        if not bound:
            raise OSError(f"rank {rank} could not bind {target(host, port)}")
        # links to peers on this machine: made before serving, so Ping can name its socket
        self.nearby = None if nearby is None else nearby(self)
        self._server.start()
        self.address = target(host, bound)

    @property
    def shm_socket(self) -> str:
        """The shm transport's doorbell socket; "" = messages only over gRPC."""
        return "" if self.nearby is None else self.nearby.name

    def connect(self, addresses: list[str], timeout: float | None = None) -> None:
        """Open a stream to every peer (after rendezvous handed out `addresses`, one per rank),
        then, with `nearby`, a shared-memory link to every peer on this machine."""
        if len(addresses) != self.world_size:
            raise ValueError(f"{len(addresses)} addresses for a world of {self.world_size}")
        timeout = self.timeout if timeout is None else timeout
        for dst, address in enumerate(addresses):
            if dst != self.rank:
                self.streams[dst] = PeerLink(self, dst, address)
                self.streams[dst].open(timeout)
        self.routes = dict(self.streams)
        if self.nearby is not None:
            me = host_identity()
            here = {dst: link.peer.shm for dst, link in self.streams.items()
                    if me and link.peer.host == me and link.peer.shm}
            self.routes.update(self.nearby.connect(here, time.monotonic() + timeout))

    def _post(self, dst: int, msg: Message, chunk) -> Request:
        self._check_size(msg)
        if dst == self.rank:  # to itself: straight into the mailbox
            request = Request(self, dst, msg.tag, msg.array.nbytes, msg.step, chunk)
            msg.array = msg.array.copy()
            self.deliver(msg)
            return request
        return self.routes[dst].send(msg, chunk)

    def _receiving(self, src: int):
        link = self.routes.get(src)
        return link.receiving() if link is not None else contextlib.nullcontext()

    def send_buffer(self, dst: int, shape, dtype) -> np.ndarray:
        link = self.routes.get(dst)
        return (link.send_buffer(shape, dtype) if link is not None
                else super().send_buffer(dst, shape, dtype))

    def _pump(self, src: int):
        link = self.routes.get(src)
        return None if link is None else link.pump

    def open_window(self, nbytes: int):
        """This rank's symmetric window and every peer's, mapped here (comm.window.rendezvous):
        over shared memory only, so the shm transport with every rank on this machine."""
        if self.nearby is None:
            raise WindowsUnavailable(f"rank {self.rank}: the grpc transport cannot map its peers' "
                                     f"memory: run on Cluster(transport='shm') for windows")
        self.windows_opened += 1
        return self.windows_opened, *self.nearby.open_window(
            self.windows_opened, nbytes, time.monotonic() + self.timeout)

    def close_window(self, number: int) -> None:
        self.nearby.close_window(number)

    def peers_on_shm(self) -> list[int]:
        """The ranks this one reaches through shared memory (none: every message is gRPC)."""
        return sorted(dst for dst, link in self.routes.items() if link.via == "shm")

    def bytes_copied(self) -> int:
        """Bytes this rank's sends have copied into shared memory (or socket frames) so far;
        an array made by `send_buffer` is sent where it lies, uncopied (0 without shm)."""
        return sum(link.copied for link in self.routes.values() if link.via == "shm")

    def _check_size(self, msg: Message) -> None:
        if msg.array.nbytes > self.max_message_bytes:
            raise ValueError(f"rank {self.rank}: a {msg.array.nbytes}-byte message is over this "
                             f"cluster's limit of {self.max_message_bytes} bytes; "
                             f"send it in pieces")

    def abort(self, error: CollectiveError) -> None:
        super().abort(error)
        for link in self.routes.values():
            link.abort(error)

    def close(self, drain: float = 5.0) -> None:
        """End every stream, wait up to `drain` seconds until peers have read what was sent,
        then stop serving (non-blocking collectives end first, while the links still work)."""
        super().close()
        self.closing = True
        if self.nearby is not None:
            self.nearby.close()
        deadline = time.monotonic() + drain
        for link in self.streams.values():
            link.finish()
        for link in self.streams.values():
            link.drained(max(deadline - time.monotonic(), 0.01))
        for link in self.streams.values():
            link.close()
        self._server.stop(grace=0.2).wait(2)
        # its idle threads end now (a handler still waiting, a rendezvous Join, ends at its own
        # deadline: waiting for it here would hold close() that long)
        self._serving.shutdown(wait=False, cancel_futures=True)

    # --- the server side --------------------------------------------------------------------
    def _serve_ping(self, request, context):
        return pb.PingReply(rank=self.rank, world_size=self.world_size, host=host_identity(),
                            shm=self.shm_socket)

    def _serve_join(self, request, context):
        # set on rank 0 of an SPMD launch (allreduce_edu.runtime.rendezvous)
        if self.rendezvous is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"rank {self.rank} runs no rendezvous")
        return self.rendezvous(request, context)

    def _serve_exchange(self, frames, context):
        """Assemble frames into arrays and deliver each complete one to the mailbox, in order."""
        assembler = Assembler(self.rank, self.world_size, self._peer_rank(context),
                              self.max_message_bytes)
        for frame in frames:
            try:
                message = assembler.add(frame)
            except WireError as e:
                log.warning("rank %d refused a frame from rank %d: %s", self.rank, assembler.src, e)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"rank {self.rank}: {e}")
            if message is not None:
                self.deliver(message)
        return pb.ExchangeSummary(messages=assembler.messages)

    def _peer_rank(self, context) -> int:
        value = dict(context.invocation_metadata()).get(RANK_KEY, "")
        if not value.isdigit() or not 0 <= int(value) < self.world_size or int(value) == self.rank:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad {RANK_KEY} metadata {value!r}")
        return int(value)
