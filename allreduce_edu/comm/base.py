"""The Communicator: the one seam between algorithms and transports. Introduced in lessons/01."""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np

from ..trace import Event, Receive, Trace
from .errors import CollectiveError
from .mailbox import Mailbox, Message, Signature

#: dtypes that may travel on the wire (numbers only: never objects, never pickles)
WIRE_DTYPES = frozenset(np.dtype(t).name for t in (
    "float16", "float32", "float64", "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64"))


def check_array(array, what: str = "array") -> np.ndarray:
    """Return `array` as a C-contiguous NumPy array of a wire dtype
    (lists convert as `np.asarray` does)."""
    array = np.asarray(array)
    if array.dtype.name not in WIRE_DTYPES:
        raise TypeError(f"{what} has dtype {array.dtype}, which cannot travel between ranks; "
                        f"use one of {', '.join(sorted(WIRE_DTYPES))}")
    return array if array.flags.c_contiguous else np.array(array, order="C")  # keeps 0-d arrays 0-d


class Request:
    """A send in flight (as MPI's `Isend` returns): `wait()` returns once the data is on its way.

    Sends are eager, like MPI's for small messages: the data has been copied out of your array
    (into the peer's mailbox, or into the gRPC stream), so you may reuse the array; the peer may
    not hold it yet.
    """

    def __init__(self, comm: Communicator, dst: int, tag: str, nbytes: int, step: int, chunk):
        self._comm, self._done, self.via = comm, False, comm.transport
        self.dst, self.tag, self.nbytes, self.step, self.chunk = dst, tag, nbytes, step, chunk
        self.t_start = time.perf_counter()

    # transports override: block until the peer acknowledged
    def _wait(self, deadline: float) -> None:
        pass

    def wait(self, timeout: float | None = None) -> None:
        if self._done:
            return
        self._wait(time.monotonic() + (self._comm.timeout if timeout is None else timeout))
        self._done = True
        c = self._comm
        sig = c._signature
        c.trace.record(Event(c.rank, self.dst, self.tag, self.step, self.nbytes, self.t_start,
                             time.perf_counter(), self.chunk,
                             f"{sig.collective}/{sig.algorithm}".rstrip("/") if sig else "",
                             self.via))


class Communicator:
    """What an algorithm sees of the world: its `rank`, the `world_size`,
    and send/recv between ranks.

    Transports implement `_post` (start moving a message to `dst`); everything else is shared.
    """

    transport = "local"  # what carries its messages (each Request may say otherwise)
    _progress = None  # the communication thread of non-blocking collectives, once one is issued

    def __init__(self, rank: int, world_size: int, timeout: float = 30.0):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside the world (world_size={world_size})")
        self.rank, self.world_size, self.timeout = rank, world_size, timeout
        self.trace = Trace()
        self._mailbox = Mailbox(rank, world_size)
        self._epoch = 0
        self._collective_id = 0
        self._signature: Signature | None = None
        # emulated links (allreduce_edu.comm.links): delay each send as its link would
        self.links = None
        self.ranks_per_node: int | None = None  # consecutive ranks that share a node; None: unknown

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, world_size={self.world_size})"

    def use_links(self, links) -> None:
        """Delay every send as the emulated `links` would (None: no delay);
        their nodes become this world's."""
        self.links = links
        self.ranks_per_node = links.ranks_per_node if links is not None else self.ranks_per_node

    # --- point to point -------------------------------------------------------------------
    def isend(self, dst: int, array, tag: str, *, step: int = -1, chunk=None) -> Request:
        """Start sending `array` to rank `dst`; returns a Request to `wait()` on."""
        self._check_peer(dst, "dst")
        if not isinstance(tag, str):
            raise TypeError(f"rank {self.rank}: tag must be a string, got {tag!r}")
        if not -1 <= step < 1 << 20:
            raise ValueError(f"rank {self.rank}: step={step} is out of range "
                             f"(-1 for none, else 0 .. 2^20-1)")
        array = check_array(array)
        chunk = ((chunk, chunk + 1) if isinstance(chunk, (int, np.integer))
                 else (tuple(chunk) if chunk else None))
        msg = Message(self.rank, tag, array, self._epoch, self._current_id(), self._signature, step)
        t_start = time.perf_counter()
        if self.links is not None:  # the emulated link's time is part of the send
            self.links.transmit(self.rank, dst, array.nbytes)
        request = self._post(dst, msg, chunk)
        request.t_start = t_start
        return request

    def send(self, dst: int, array, tag: str, *, step: int = -1, chunk=None) -> None:
        """Send `array` to rank `dst`; returns once the data is on its way
        (eager: your array is free again)."""
        self.isend(dst, array, tag, step=step, chunk=chunk).wait()

    def recv(self, src: int, tag: str, timeout: float | None = None) -> np.ndarray:
        """Wait for the next array `src` sent with `tag`; raises instead of waiting forever."""
        self._check_peer(src, "src")
        t_start = time.perf_counter()
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        msg = self._mailbox.take(src, tag, self._epoch, self._current_id(), self._signature,
                                 deadline, self._pump(src))
        self.trace.record_receive(Receive(self.rank, src, tag, msg.step, msg.array.nbytes, t_start,
                                          msg.t_arrived, time.perf_counter()))
        return msg.array

    def sendrecv(self, dst: int, array, src: int, tag: str, *, step: int = -1, chunk=None,
                 timeout: float | None = None) -> np.ndarray:
        """Send to `dst` while receiving from `src` (the ring step):
        full duplex, so it never deadlocks."""
        request = self.isend(dst, array, tag, step=step, chunk=chunk)
        received = self.recv(src, tag, timeout)
        request.wait(timeout)
        return received

    def send_buffer(self, dst: int, shape, dtype) -> np.ndarray:
        """An empty array to fill and then send to `dst` (as NCCL's ranks write straight into the
        peer's buffer). Where the transport can, it lives where the message travels from (the
        shm transport: a shared segment), so sending it copies nothing. Once sent, it is the
        receiver's: do not write to it again."""
        return np.empty(shape, dtype)

    def barrier(self) -> None:
        """Return once every rank has called barrier
        (dissemination: ⌈log2 N⌉ rounds of empty messages)."""
        with self.collective("barrier"):
            empty = np.empty(0, np.uint8)
            distance, step = 1, 0
            while distance < self.world_size:
                # step s: tell rank + 2^s you are here, hear from rank - 2^s
                self.sendrecv((self.rank + distance) % self.world_size, empty,
                              (self.rank - distance) % self.world_size, "barrier", step=step)
                distance, step = distance * 2, step + 1

    # --- collectives ----------------------------------------------------------------------
    @contextlib.contextmanager
    def collective(self, name: str, *, algorithm: str = "", op: str = "", dtype="", shape=(),
                   root: int = -1):
        """Mark the messages inside as one collective, so ranks that disagree on it fail loudly.

        Nested calls (ring all-reduce calling reduce-scatter) belong to the outermost collective.
        """
        progress = self._progress  # non-blocking collectives first (collectives/nonblocking.py):
        if progress is not None and threading.current_thread() is not progress.thread:
            progress.drain()  # the signature below may be theirs until they are done
        if self._signature is not None:
            yield
            return
        self._collective_id += 1
        self._signature = Signature(name, algorithm, op,
                                    np.dtype(dtype).name if dtype != "" else "",
                                    tuple(int(s) for s in shape), root)
        self._mailbox.discard_collectives_before(self._epoch, self._collective_id)
        try:
            yield
        finally:
            self._signature = None

    def _current_id(self) -> int:
        return self._collective_id if self._signature is not None else 0

    # --- lifecycle (called by the Cluster) ------------------------------------------------
    def begin_run(self, epoch: int) -> None:
        """Start a fresh run: new epoch, empty trace, no abort pending."""
        self._epoch, self._collective_id, self._signature = epoch, 0, None
        self.trace.clear()
        self._mailbox.reset(epoch)

    def abort(self, error: CollectiveError) -> None:
        """Stop every wait on this rank now by raising `error` in it."""
        self._mailbox.abort(error)

    def close(self) -> None:
        """Release the transport's resources (transports call this first)."""
        if self._progress is not None:  # the communication thread of non-blocking collectives
            self._progress.close()
            self._progress = None

    # --- for transports -------------------------------------------------------------------
    def _post(self, dst: int, msg: Message, chunk) -> Request:
        raise NotImplementedError

    def _pump(self, src: int):
        """How a recv from `src` waits: None (until another thread delivers), or a callable
        that reads the transport on the caller's thread (the shm transport: no thread hop)."""
        return None

    def _check_peer(self, peer, what: str) -> None:
        if not isinstance(peer, (int, np.integer)) or not 0 <= peer < self.world_size:
            raise ValueError(f"rank {self.rank}: {what}={peer!r} is not a rank of this world "
                             f"(valid: 0..{self.world_size - 1})")
