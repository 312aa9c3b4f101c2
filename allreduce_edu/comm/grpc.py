"""gRPC transport: every rank serves `Rank` on 127.0.0.1 and keeps one Exchange stream open
to each peer.

A send returns once its data is copied into the stream (as MPI's eager sends do), not when the peer
holds it: a per-message acknowledgement cost a third of the small-message latency here. A peer that
dies ends the stream, which fails every later send to it and every recv from it with RankFailure.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from concurrent import futures

import grpc

from .._proto import rank_pb2 as pb
from .._proto import rank_pb2_grpc
from .auth import RANK_KEY, TLS, TOKEN_KEY, TokenInterceptor, channel
from .base import Communicator, Request
from .errors import CollectiveError, CollectiveTimeout, RankFailure
from .mailbox import Message
from .wire import CHUNK_BYTES, MAX_MESSAGE_BYTES, Assembler, WireError, encode_frames

log = logging.getLogger("allreduce_edu")

SERVICE = pb.DESCRIPTOR.services_by_name["Rank"].full_name  # "allreduce_edu.Rank"
EXCHANGE = f"/{SERVICE}/Exchange"
SERVER_OPTIONS = [("grpc.so_reuseport", 0)]  # one port, one rank


class GrpcRequest(Request):
    """A send in flight on a peer's stream; done once its last frame is encoded
    (the data is on its way)."""

    def __init__(self, *args):
        super().__init__(*args)
        self._event, self._error = threading.Event(), None

    def finish(self, error: CollectiveError | None = None) -> None:
        self._error = self._error or error
        self._event.set()

    def _wait(self, deadline: float) -> None:
        if not self._event.wait(max(deadline - time.monotonic(), 0)):
            c = self._comm
            raise CollectiveTimeout(f"rank {c.rank}: rank {self.dst} did not take {self.tag!r} "
                                    f"({self.nbytes} bytes) before the deadline", ranks=(self.dst,))
        if self._error is not None:
            raise self._error


class PeerLink:
    """This rank's one-way pipe to one peer:
    a client stream of frames that stays open for the cluster's life."""

    def __init__(self, comm: GrpcCommunicator, dst: int, address: str):
        self.comm, self.dst, self.address = comm, dst, address
        self.channel = channel(address, comm.tls)
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: dict[int, GrpcRequest] = {}
        self._lock = threading.Lock()
        self._seq = 0
        self._error: RankFailure | None = None

    def open(self, timeout: float) -> None:
        """Wait for the peer to answer Ping, then open the Exchange stream."""
        md = self.comm.metadata
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout)
            reply = rank_pb2_grpc.RankStub(self.channel).Ping(pb.PingRequest(src=self.comm.rank),
                                                             metadata=md, timeout=timeout)
        except (grpc.FutureTimeoutError, grpc.RpcError) as e:
            why = (e.details() if isinstance(e, grpc.RpcError)
                   else f"no answer within {timeout:.0f} s")
            raise RankFailure(f"rank {self.comm.rank} cannot reach rank {self.dst} at "
                              f"{self.address}: {why}", ranks=(self.dst,)) from None
        if (reply.rank, reply.world_size) != (self.dst, self.comm.world_size):
            raise RankFailure(f"{self.address} is rank {reply.rank} of {reply.world_size}, "
                              f"not rank {self.dst} of {self.comm.world_size}", ranks=(self.dst,))
        self.peer = reply  # its host and shared-memory socket, for the shm transport
        exchange = self.channel.stream_unary(EXCHANGE, request_serializer=None,
                                             response_deserializer=pb.ExchangeSummary.FromString)
        self._call = exchange.future(self._frames(), metadata=md)
        # runs when the stream ends: the peer closed or died
        self._call.add_done_callback(self._ended)

    def post(self, msg: Message, request: GrpcRequest) -> None:
        with self._lock:
            if self._error is not None:
                raise self._error
            self._seq += 1
            self._pending[self._seq] = request
            # under the lock: threads sending at once keep seq order
            self._outbox.put((msg, self._seq))

    def _frames(self):
        """The request stream: encode each message as gRPC asks for more
        (so gRPC's flow control holds senders back)."""
        while (item := self._outbox.get()) is not None:
            msg, seq = item
            frames = encode_frames(msg, seq, self.comm.chunk_bytes)
            frame = next(frames)
            for following in frames:
                yield frame
                frame = following
            with self._lock:  # the last frame holds a copy of the data: the sender's buffer is free
                request = self._pending.pop(seq, None)
            if request is not None:
                request.finish()
            yield frame

    def _ended(self, call) -> None:
        if self.comm.closing:
            return
        try:
            reason = f"{call.code().name}: {call.details()}"
        except Exception:  # noqa: BLE001 - a cancelled future has no details
            reason = "its stream ended"
        error = RankFailure(f"rank {self.dst} is gone (rank {self.comm.rank}'s stream to it at "
                            f"{self.address} ended: {reason})", ranks=(self.dst,))
        self.fail(error)
        self.comm._mailbox.peer_failed(self.dst, f"its connection ended ({reason})")

    def fail(self, error: CollectiveError, forever: bool = True) -> None:
        """Finish every send in flight with `error` (and, if `forever`, every later one)."""
        with self._lock:
            if forever:
                self._error = error
            pending, self._pending = self._pending, {}
        for request in pending.values():
            request.finish(error)

    def finish(self) -> None:
        """End the stream: the receiver reads what is queued, then answers."""
        self._outbox.put(None)

    def drained(self, timeout: float) -> None:
        """Wait until the receiver has read the whole stream (or gave up on it)."""
        try:
            self._call.result(timeout=timeout)
        except Exception:  # noqa: BLE001 - a peer that left first already read all it needed
            pass

    def close(self) -> None:
        self._outbox.put(None)
        self.channel.close()


def host_identity() -> str:
    """Which machine this is, as shared memory sees it: the boot id and the network namespace
    (ranks in two namespaces cannot reach each other's abstract Unix sockets)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.stat('/proc/self/ns/net').st_ino}"
    except OSError:  # not Linux: no shared memory transport
        return ""


class GrpcCommunicator(Communicator):
    """A rank whose messages travel over gRPC between processes (or machines)."""

    transport = "grpc"
    shm_socket = ""  # the shm transport's doorbell socket; "" = messages only over gRPC

    def __init__(self, rank: int, world_size: int, *, token: str, host: str = "127.0.0.1",
                 port: int = 0, timeout: float = 30.0, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 chunk_bytes: int = CHUNK_BYTES, tls: TLS | None = None):
        super().__init__(rank, world_size, timeout)
        if not token:
            raise ValueError("a gRPC rank needs the cluster's token: ranks refuse calls without it")
        self.tls = tls
        # a callable(JoinRequest, context) -> JoinReply on the rank that hosts one
        self.rendezvous = None
        self.metadata = ((TOKEN_KEY, token), (RANK_KEY, str(rank)))
        self.max_message_bytes, self.chunk_bytes = max_message_bytes, chunk_bytes
        self.closing = False
        self._links: dict[int, PeerLink] = {}
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=world_size + 8,
                                       thread_name_prefix=f"rank{rank}-server"),
            interceptors=[TokenInterceptor(token)], options=SERVER_OPTIONS)
        self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {
            "Exchange": grpc.stream_unary_rpc_method_handler(
                self._serve_exchange, response_serializer=pb.ExchangeSummary.SerializeToString),
            "Ping": grpc.unary_unary_rpc_method_handler(
                self._serve_ping, pb.PingRequest.FromString, pb.PingReply.SerializeToString),
            "Join": grpc.unary_unary_rpc_method_handler(
                self._serve_join, pb.JoinRequest.FromString, pb.JoinReply.SerializeToString),
        })])
        bound = (self._server.add_secure_port(f"{host}:{port}", tls.server_credentials()) if tls
                 else self._server.add_insecure_port(f"{host}:{port}"))
        if not bound:
            raise OSError(f"rank {rank} could not bind {host}:{port}")
        self._server.start()
        self.address = f"{host}:{bound}"

    def connect(self, addresses: list[str], timeout: float | None = None) -> None:
        """Open a stream to every peer (after rendezvous handed out `addresses`, one per rank)."""
        if len(addresses) != self.world_size:
            raise ValueError(f"{len(addresses)} addresses for a world of {self.world_size}")
        for dst, address in enumerate(addresses):
            if dst != self.rank:
                self._links[dst] = PeerLink(self, dst, address)
                self._links[dst].open(self.timeout if timeout is None else timeout)

    def _post(self, dst: int, msg: Message, chunk) -> Request:
        self._check_size(msg)
        request = GrpcRequest(self, dst, msg.tag, msg.array.nbytes, msg.step, chunk)
        if dst == self.rank:  # to itself: straight into the mailbox
            msg.array = msg.array.copy()
            self._mailbox.deliver(msg)
            request.finish()
        else:
            request.via = "grpc"
            self._links[dst].post(msg, request)
        return request

    def peers_on_shm(self) -> list[int]:
        """The ranks this one reaches through shared memory (none: every message is gRPC)."""
        return []

    def _check_size(self, msg: Message) -> None:
        if msg.array.nbytes > self.max_message_bytes:
            raise ValueError(f"rank {self.rank}: a {msg.array.nbytes}-byte message is over this "
                             f"cluster's limit of {self.max_message_bytes} bytes; "
                             f"send it in pieces")

    def abort(self, error: CollectiveError) -> None:
        super().abort(error)
        for link in self._links.values():
            link.fail(error, forever=False)

    def close(self, drain: float = 5.0) -> None:
        """End every stream, wait up to `drain` seconds until peers have read what was sent,
        then stop serving."""
        super().close()
        self.closing = True
        deadline = time.monotonic() + drain
        for link in self._links.values():
            link.finish()
        for link in self._links.values():
            link.drained(max(deadline - time.monotonic(), 0.01))
        for link in self._links.values():
            link.close()
        self._server.stop(grace=0.2).wait(2)

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
                self._mailbox.deliver(message)
        return pb.ExchangeSummary(messages=assembler.messages)

    def _peer_rank(self, context) -> int:
        value = dict(context.invocation_metadata()).get(RANK_KEY, "")
        if not value.isdigit() or not 0 <= int(value) < self.world_size or int(value) == self.rank:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad {RANK_KEY} metadata {value!r}")
        return int(value)
