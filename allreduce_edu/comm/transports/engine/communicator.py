"""Our Communicator over another engine's point-to-point (MPI, torch.distributed).
Introduced in lessons/09.

Engines match a message by (src, integer tag), first in first out, and cannot say how big it is
before it arrives. So each message travels as two: a fixed-size int64 header (tag check, collective,
step, dtype, shape) and then the array's raw bytes under the same integer tag (never pickles).
A string tag's integer tag is crc32(tag) mod the engine's limit, the same on every rank; the header
carries the whole crc32, so two tags that land on one integer fail loudly instead of crossing.
"""

from __future__ import annotations

import time
import zlib

import numpy as np

from ....trace import Receive
from ...base import WIRE_DTYPES, Communicator, Request
from ...errors import CollectiveMismatch, CollectiveTimeout
from ...mailbox import Message
from ...request import check_timeout

MAX_DIMS = 32
# crc32(tag), collective id, crc32(signature), step, dtype, ndim, nbytes, shape...
HEADER = 7 + MAX_DIMS
DTYPES = sorted(WIRE_DTYPES)  # a dtype travels as its index here


def crc(text: str) -> int:
    return zlib.crc32(text.encode())


def pack_header(msg: Message) -> np.ndarray:
    """The int64 header that precedes a message's bytes."""
    a = msg.array
    if a.ndim > MAX_DIMS:
        raise ValueError(f"an array of {a.ndim} dimensions cannot travel (at most {MAX_DIMS})")
    header = np.zeros(HEADER, np.int64)
    header[:7] = (crc(msg.tag), msg.collective_id, crc(str(msg.signature)) if msg.signature else 0,
                  msg.step, DTYPES.index(a.dtype.name), a.ndim, a.nbytes)
    header[7:7 + a.ndim] = a.shape
    return header


def as_bytes(array: np.ndarray) -> np.ndarray:
    """A flat uint8 view of a C-contiguous array (what engines send and receive into)."""
    return array.reshape(-1).view(np.uint8)


class EngineRequest(Request):
    """A send in flight on an engine:
    done when the engine has finished both header and data sends."""

    def __init__(self, comm, dst, tag, nbytes, step, chunk, handles, keep):
        super().__init__(comm, dst, tag, nbytes, step, chunk)
        # the buffers must live until the engine is done with them
        self._handles, self._keep = handles, keep

    def _wait(self, deadline: float) -> None:
        for handle in self._handles:
            if not self.comm._wait(handle, deadline):
                raise CollectiveTimeout(f"rank {self.comm.rank}: rank {self.dst} did not take "
                                        f"{self.tag!r} ({self.nbytes} bytes) before the deadline",
                                        ranks=(self.dst,))
        self._handles = self._keep = ()


class EngineCommunicator(Communicator):
    """Send/recv over an engine; subclasses give `_isend`, `_irecv`, `_wait`
    and the engine's own all-reduce."""

    engine = ""  # "mpi", "gloo": the name of the engine's own all-reduce in bench rows

    @property
    def transport(self) -> str:  # what carries the messages: the engine
        return self.engine
    tag_limit = 2**31 - 1  # integer tags run 0 .. tag_limit - 1

    def _post(self, dst: int, msg: Message, chunk) -> Request:
        if dst == self.rank:  # to itself: straight into the mailbox, as the gRPC transport does
            msg.array = msg.array.copy()
            self.deliver(msg)
            return EngineRequest(self, dst, msg.tag, msg.array.nbytes, msg.step, chunk, (), ())
        tag, header = crc(msg.tag) % self.tag_limit, pack_header(msg)
        array = msg.array if msg.array.flags.writeable else msg.array.copy()
        handles = [self._isend(dst, tag, header)] + ([self._isend(dst, tag, as_bytes(array))]
                                                     if array.nbytes else [])
        return EngineRequest(self, dst, msg.tag, array.nbytes, msg.step, chunk, handles,
                             (header, array))

    def issend(self, dst: int, array, tag: str, *, step: int = -1, chunk=None) -> Request:
        """Not on an engine: its receiver would not send the receipt back."""
        raise NotImplementedError(f"rank {self.rank}: ssend runs on this package's transports "
                                  f"(threads, gRPC, shm), not on {self.engine}; gloo's send "
                                  f"always waits for the receiver (MPI: MPI_Ssend)")

    def recv(self, src: int, tag: str, timeout: float | None = None) -> np.ndarray:
        """The next array `src` sent with `tag`: the header first, then the bytes it announces."""
        if src == self.rank:
            return super().recv(src, tag, timeout)
        self.check_peer(src, "src")
        if timeout is not None:
            check_timeout(self.rank, timeout)
        t_start = time.perf_counter()
        call = self.current_call()
        deadline = time.monotonic() + (timeout if timeout is not None
                                       else call.timeout if call else self.timeout)
        number, header = crc(tag) % self.tag_limit, np.zeros(HEADER, np.int64)
        self._receive(src, number, header, deadline, tag, call)
        tag_crc, collective_id, signature, step, dtype, ndim, nbytes = (int(v) for v in header[:7])
        self._check(src, tag, tag_crc, collective_id, signature, call)
        array = np.empty(tuple(int(d) for d in header[7:7 + ndim]), DTYPES[dtype])
        if array.nbytes:
            self._receive(src, number, as_bytes(array), deadline, tag, call)
        t_end = time.perf_counter()
        self.trace.record_receive(Receive(self.rank, src, tag, step, nbytes, t_start, t_end, t_end))
        return array

    def _receive(self, src: int, number: int, buffer: np.ndarray, deadline: float,
                 tag: str, call) -> None:
        if not self._wait(self._irecv(src, number, buffer), deadline):
            sig = f"in {call.signature}" if call else "(plain recv)"
            raise CollectiveTimeout(f"rank {self.rank} waited past its deadline for {tag!r} "
                                    f"from rank {src} {sig}; "
                                    f"is rank {src} stuck, or did it call something else?",
                                    ranks=(src,))

    def _check(self, src: int, tag: str, tag_crc: int, collective_id: int, signature: int,
               call) -> None:
        """Fail loudly when the message is not the one this rank is waiting for."""
        if tag_crc != crc(tag):
            raise CollectiveMismatch(f"rank {self.rank} waited for {tag!r} from rank {src} "
                                     f"but got another tag (crc32 {tag_crc}) under the same "
                                     f"integer tag; rename one of the two tags",
                                     ranks=(src, self.rank))
        mine = (call.collective_id, crc(str(call.signature))) if call else (0, 0)
        if (collective_id, signature) != mine:
            raise CollectiveMismatch(
                f"rank {src} sent {tag!r} from its collective #{collective_id} "
                f"but rank {self.rank} is in collective #{mine[0]} "
                f"({call.signature if call else 'plain recv'}), or they called it with different "
                f"shape, dtype, op or algorithm. "
                f"Every rank must call the same collectives in the same order.",
                ranks=(src, self.rank))

    # --- what each engine provides ------------------------------------------------------------
    def _isend(self, dst: int, tag: int, buffer: np.ndarray):
        raise NotImplementedError

    def _irecv(self, src: int, tag: int, buffer: np.ndarray):
        raise NotImplementedError

    def _wait(self, handle, deadline: float) -> bool:
        """Block until `handle` completes (True) or the deadline passes (False)."""
        raise NotImplementedError

    def builtin_allreduce(self, x: np.ndarray, op: str = "sum") -> np.ndarray:
        """The engine's own all-reduce:
        the reference our algorithms are checked and timed against."""
        raise NotImplementedError
