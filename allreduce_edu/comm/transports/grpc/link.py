"""One gRPC link between two ranks: a client stream of frames to the peer that stays open for the
cluster's life (communicator.py keeps one per peer, and uses it unless a shared-memory link to
that peer, comm/transports/shm/link.py, takes its messages)."""

from __future__ import annotations

import contextlib
import queue
import threading
import time

import grpc
import numpy as np

from ...._proto import rank_pb2 as pb
from ...._proto import rank_pb2_grpc
from ...auth import channel
from ...base import Request
from ...errors import CollectiveError, CollectiveTimeout, RankFailure
from ...mailbox import Message
from ...wire import encode_frames

SERVICE = pb.DESCRIPTOR.services_by_name["Rank"].full_name  # "allreduce_edu.Rank"
EXCHANGE = f"/{SERVICE}/Exchange"


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
            c = self.comm
            raise CollectiveTimeout(f"rank {c.rank}: rank {self.dst} did not take {self.tag!r} "
                                    f"({self.nbytes} bytes) before the deadline", ranks=(self.dst,))
        if self._error is not None:
            raise self._error


class PeerLink:
    """This rank's one-way pipe to one peer:
    a client stream of frames that stays open for the cluster's life."""

    via = "grpc"
    pump = None  # a recv from this peer waits until the server's thread delivers

    def __init__(self, comm, dst: int, address: str):
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

    def send(self, msg: Message, chunk) -> GrpcRequest:
        """Queue `msg` on the stream; the request is done once its last frame is encoded."""
        request = GrpcRequest(self.comm, self.dst, msg.tag, msg.array.nbytes, msg.step, chunk)
        request.via = "grpc"
        self.post(msg, request)
        return request

    def send_buffer(self, shape, dtype) -> np.ndarray:
        """A plain array: the stream copies what it sends anyway."""
        return np.empty(shape, dtype)

    def receiving(self):
        """Nothing to set up for a recv: the server's thread delivers."""
        return contextlib.nullcontext()

    def abort(self, error: CollectiveError) -> None:
        """Finish the sends in flight with `error` (later ones may go again)."""
        self.fail(error, forever=False)

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
        self.comm.peer_failed(self.dst, f"its connection ended ({reason})")

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
