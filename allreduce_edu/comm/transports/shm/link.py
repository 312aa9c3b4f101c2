"""One shared-memory link between two ranks on one machine (made by ShmLinks, __init__.py): a
ring each way for small messages (eager.py), a channel for the other headers (doorbell.py),
doorbells, segment handles and releases (a frame's kinds: kinds.py), and the segments each side
sends from (segments.py); the backend (backend.py: linux or portable) provides channel and
memory."""

from __future__ import annotations

import logging
import math
import threading
import time

import numpy as np

from ...base import Request
from ...dtypes import as_shape
from ...errors import CollectiveTimeout, RankFailure
from ...mailbox import Message
from ...wire import Assembler, WireError
from .backend import INLINE_BYTES, Backend, Channel
from .doorbell import frames, pack
from .eager import CAPACITY, DOORBELL, Incoming, open_ring, ring_one
from .kinds import MESSAGE, RELEASE, take
from .segments import Outbox, Pool

log = logging.getLogger("allreduce_edu")

TICK = 0.5  # how often waiting threads look whether their communicator is closing
QUIET = TICK  # the link's thread reads only after this long without a recv (waking it: ~30 us)


class ShmLink:
    """This rank's link with one peer on the same machine: a channel (headers, doorbells, segment
    handles, releases), the segments it sends from, those it reads from."""

    via = "shm"

    def __init__(self, comm, peer: int, channel: Channel, backend: Backend):
        self.comm, self.peer = comm, peer
        self.channel, self.backend = channel, backend
        self._reading = threading.Lock()  # one reader at a time: a recv's thread, or the link's
        self._callers, self._last_recv = 0, 0.0
        self._closed = threading.Event()  # wakes the link's thread at once when the link closes
        self._ended = False
        self.pool = Pool(backend.new_segment)
        self.copied = 0  # bytes copied into segments or frames (not those filled in place)
        self.theirs: dict = {}  # segment id -> the peer's segment, mapped here
        self.windows: dict = {}  # window number -> the peer's window, mapped here (window.py)
        self.leased: set[int] = set()
        self.error: RankFailure | None = None
        self._lock = threading.RLock()  # a release may be sent by a finaliser inside a send
        self._seq = 0
        self.assembler = Assembler(comm.rank, comm.world_size, peer, comm.max_message_bytes)
        self.incoming: Incoming | None = None  # the peer's ring (eager.py), once it has come
        self.outgoing = open_ring(self)
        self.doorbells = 0  # rung: the peer slept on its socket while our ring had its message
        self._thread = threading.Thread(target=self._receive, daemon=True,
                                        name=f"rank{comm.rank}-shm-from-{peer}")
        self._thread.start()

    def send(self, msg: Message, chunk) -> Request:
        """Post `msg` (eager: the data is in the segment when this returns)."""
        self.post(msg)
        return Request(self.comm, self.peer, msg.tag, msg.array.nbytes, msg.step, chunk)

    def send_buffer(self, shape, dtype) -> np.ndarray:
        """An array in this link's segments, sent uncopied (small ones, or a full pool: plain)."""
        dtype = np.dtype(dtype)
        shape = as_shape(shape)
        if dtype.itemsize * math.prod(shape) <= INLINE_BYTES or self.error is not None:
            return np.empty(shape, dtype)
        outbox = self.outbox(shape, dtype)
        return np.empty(shape, dtype) if outbox is None else outbox

    def abort(self, error) -> None:  # nothing in flight to fail: a posted message is the peer's
        return

    def post(self, msg: Message) -> None:
        """Copy `msg` into the peer's ring (small: eager.py), a segment, or frames on the socket;
        ring the peer's doorbell unless it will find the message without one."""
        nbytes = msg.array.nbytes
        if nbytes <= INLINE_BYTES:  # small: it travels in the frame (an Outbox never is small)
            self.copied += nbytes
            with self._lock:
                seq = self._next_seq()
                if (nbytes <= CAPACITY and self.outgoing is not None
                        and self.outgoing.put(pack(msg, seq, 0, nbytes), msg.array)):
                    if self.outgoing.asleep():  # else the peer finds it without a doorbell
                        self.doorbells += 1
                        self._send([DOORBELL])
                    return
                self._send_inline(msg, seq)
            return
        outbox = Outbox.of(msg.array)
        if outbox is not None and outbox.link is self and not outbox.sent:
            segment, outbox.sent = outbox.segment, True  # filled in place: nothing to copy
        else:
            self.drain()  # the peer's releases first: free segments, not a new one
            segment = self.pool.acquire(nbytes)
            self.copied += nbytes
            if segment is None:  # the pool is full: in frames on the socket
                with self._lock:
                    self._send_inline(msg, self._next_seq())
                return
            segment.bytes[:nbytes] = msg.array.reshape(-1).view(np.uint8)  # the one copy
        new = segment.handle is not None  # the peer has not got this segment yet
        with self._lock:
            frame = pack(msg, self._next_seq(), segment=segment.id, segment_bytes=segment.size)
            try:
                self._send([MESSAGE, frame], segment.handle)
            except BaseException:
                if new:
                    self.pool.forget(segment)
                raise
        if new:
            segment.handed_over()

    def _send_inline(self, msg: Message, seq: int) -> None:
        """`msg` in frames on the socket, header and data together (under `_lock`)."""
        for frame in frames(msg, seq, INLINE_BYTES):
            self._send([MESSAGE, *frame])

    def _next_seq(self) -> int:
        if self.error is not None:
            raise self.error
        self._seq += 1
        return self._seq

    def send_frame(self, buffers: list, handle=None) -> None:  # one frame of another kind
        with self._lock:
            self._send(buffers, handle)

    def _send(self, buffers: list, handle=None) -> None:
        """One frame (under `_lock`); a sender whose peer cannot take it reads meanwhile."""
        c = self.comm
        try:
            self.channel.send(buffers, handle, time.monotonic() + c.timeout, self.read_waiting)
        except TimeoutError:
            raise CollectiveTimeout(f"rank {c.rank}: rank {self.peer} took no message for "
                                    f"{c.timeout:.0f} s (its socket is full); is it stuck?",
                                    ranks=(self.peer,)) from None
        except OSError as e:
            self.error = RankFailure(f"rank {self.peer} is gone (rank {c.rank}'s shared-memory "
                                     f"link to it failed: {e.strerror})", ranks=(self.peer,))
            raise self.error from None

    def read_waiting(self) -> bool:
        """Read one frame already waiting, unless another thread is reading (a sender may hold
        `_lock`, which a reader's release needs); raise if the link has ended with an error."""
        got = self._read_one(wait_turn=False)
        if self._ended and self.error is not None:
            raise self.error
        return got

    def drain(self) -> None:
        """Read every frame already waiting (releases, messages), without waiting for more."""
        while not self._ended and self.read_waiting():
            pass

    def outbox(self, shape: tuple, dtype: np.dtype) -> np.ndarray | None:
        """An array in a free segment of this link's pool, or None if the pool is full."""
        segment = self.pool.acquire(dtype.itemsize * math.prod(shape))
        return None if segment is None else np.asarray(Outbox(self, segment, dtype, shape))

    def give_back(self, segment: int) -> None:
        """The last view of a received array is gone: the sender may reuse its segment."""
        self.leased.discard(segment)
        if self.error is None and not self.comm.closing:
            with self._lock:
                self._send([RELEASE, segment.to_bytes(8, "little")])

    # --- receiving: on the caller's thread while it waits in recv, else on the link's own ------
    def pump(self, seconds: float) -> None:
        """Read and handle at most one frame, waiting up to `seconds` for it: a recv reads the
        socket on its own thread (a hand-over between threads cost ~50 us here)."""
        if self._ended:
            time.sleep(min(seconds, TICK))
        elif (self.channel.wait(seconds) if self.incoming is None
              else self.incoming.wait(self.channel, seconds)):
            self._read_one()

    def receiving(self) -> ShmLink:
        """`with link.receiving():` a recv on this link is under way. The link's own thread stands
        aside meanwhile, and until the link has been QUIET a while (the next recv is likely soon).
        The link is that context manager itself (a generator-based one cost ~1 us a recv)."""
        return self

    def __enter__(self) -> None:
        with self._lock:
            self._callers += 1
        with self._reading:
            pass  # a frame the link's thread is reading now is delivered before we look

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._callers -= 1
            self._last_recv = time.monotonic()

    def _receive(self) -> None:
        """The link's own thread, once the link is QUIET: frames nobody waits for (releases, later
        messages, a dead peer's end of file). Meanwhile recvs read it and senders `drain` it."""
        while not self._ended and not self.comm.closing:
            idle = time.monotonic() - self._last_recv
            if self._callers or idle < QUIET:
                self._closed.wait(TICK if self._callers else min(TICK, QUIET - idle))
            elif self._idle_wait():
                self._read_one(own_thread=True)

    def _idle_wait(self) -> bool:
        """The link's thread sleeps on the socket; the peer rings its doorbell meanwhile."""
        if self.incoming is None:
            return self.channel.wait(TICK)
        with self.incoming.asleep():
            return self.incoming.ready() or self.channel.wait(TICK)

    def _read_one(self, own_thread: bool = False, wait_turn: bool = True) -> bool:
        """Read and handle the ring's next message (only one: a recv waits for one), else the
        socket's frames; False if none (or the link ended). A sender reads only if no one else
        does (`wait_turn=False`): it may hold `_lock`, which a reader's release can need."""
        if not self._reading.acquire(blocking=wait_turn):
            return False
        try:
            if self._ended or (own_thread and self._callers):
                return False  # a recv reads this frame on its own thread
            try:
                if ring_one(self):
                    return True  # the socket's frames wait for a call that finds the ring empty
                got = self.channel.receive()
            except OSError as e:
                self._end(f"its socket failed: {e.strerror}")
                return False
            except WireError as e:
                return self._refuse(e)
            if got is None:
                self._end("its process exited")  # end of file: closed, or died
                return False
            for i, (data, handle) in enumerate(got):
                try:
                    take(self, data, handle)
                except WireError as e:
                    for _, rest in got[i + 1:]:
                        self.backend.discard(rest)
                    return self._refuse(e)
            return bool(got)
        finally:
            self._reading.release()

    def _refuse(self, e: WireError) -> bool:
        log.warning("rank %d refused a frame from rank %d: %s", self.comm.rank, self.peer, e)
        self._end(f"it sent a frame that breaks the contract: {e}")
        return False

    def _end(self, reason: str) -> None:
        self._ended = True
        if self.comm.closing:
            return
        self.error = self.error or RankFailure(
            f"rank {self.peer} is gone (rank {self.comm.rank}'s shared-memory link to it ended: "
            f"{reason})", ranks=(self.peer,))
        self.comm.peer_failed(self.peer, f"its shared-memory link ended ({reason})")
        self.channel.shutdown()  # wakes our receiving thread; the peer sees end of file

    def close(self) -> None:
        self._ended = True
        self._closed.set()
        self.channel.shutdown()
        if self._thread is not threading.current_thread():
            self._thread.join(2 * TICK)
        self.channel.close()
        self.pool.close()
