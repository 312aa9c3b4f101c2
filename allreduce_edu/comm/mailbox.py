"""Where received messages wait for `recv`: one mailbox per rank, shared by every transport."""

from __future__ import annotations

import copy
import functools
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from time import perf_counter

import numpy as np

from .errors import CollectiveError, CollectiveMismatch, CollectiveTimeout, RankFailure

SPACE_BITS = 32  # a collective id is space << SPACE_BITS | its number in that space (comm.calls)


def earlier_in_space(key_id: int, collective_id: int) -> bool:
    """Whether collective `key_id` came before `collective_id` in the same numbering space."""
    return 0 < key_id < collective_id and key_id >> SPACE_BITS == collective_id >> SPACE_BITS

PUMP_SLICE = 0.05  # a pumping wait looks at aborts and failed peers this often


@dataclass(frozen=True)
class Signature:
    """The collective a rank is in, as it called it; every message carries its sender's."""

    collective: str
    algorithm: str = ""
    op: str = ""
    dtype: str = ""
    shape: tuple[int, ...] = ()
    root: int = -1

    def __str__(self) -> str:
        parts = [f"algorithm={self.algorithm!r}"] if self.algorithm else []
        parts += [f"op={self.op!r}"] if self.op else []
        parts += [f"root={self.root}"] if self.root >= 0 else []
        parts += [f"dtype={self.dtype}", f"shape={self.shape}"]
        return f"{self.collective}({', '.join(parts)})"


@functools.lru_cache(maxsize=256)
def signature(collective: str, algorithm: str = "", op: str = "", dtype="", shape: tuple = (),
              root: int = -1) -> Signature:
    """The Signature of a call (made once per distinct call: a frozen dataclass takes
    microseconds to build, and NumPy a microsecond to name a dtype); `dtype` as NumPy takes it,
    "" for none; `shape` a tuple of ints."""
    name = "" if isinstance(dtype, str) and not dtype else np.dtype(dtype).name
    return Signature(collective, algorithm, op, name, shape, root)


@dataclass
class Message:
    """One logical message: an array plus where it comes from and which collective it belongs to."""

    src: int
    tag: str
    array: np.ndarray
    epoch: int = 0
    collective_id: int = 0  # 0 = plain send/recv outside any collective
    signature: Signature | None = None
    step: int = -1
    t_arrived: float = 0.0  # time.perf_counter() when the whole message was in the mailbox
    synchronous: int = 0  # sent by ssend, its number (> 0): the receiver's recv acknowledges it


#: a synchronous send's tag travels as SYNCHRONOUS + its number + NUL + tag (every transport
#: carries tags as they are); the mailbox strips that, and the receiver's recv answers with
#: ACKNOWLEDGED + the same number + NUL + tag (comm.base)
SYNCHRONOUS, ACKNOWLEDGED = "\x00ssend\x00", "\x00taken\x00"


class Mailbox:
    """Messages keyed by (src, epoch, collective_id, tag), FIFO within a key;
    every wait has a deadline."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        # the lock is entered directly: a Condition's own `with` costs a microsecond here (its
        # methods are Python), twice a message; the Condition is for recvs that sleep on it
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._sleeping = 0  # recvs asleep on _cond (no pump): deliver wakes them if there are any
        self._queues: dict[tuple, deque[Message]] = defaultdict(deque)
        self._signatures: dict[tuple[int, int], dict[int, Signature]] = defaultdict(dict)
        self._failed: dict[int, str] = {}  # peer rank -> why it is gone
        self._aborted: CollectiveError | None = None
        self._epoch = 0

    def deliver(self, msg: Message) -> None:
        """Called by the transport when a whole message has arrived."""
        with self._lock:
            if msg.epoch < self._epoch:
                return  # a late message from an abandoned run: never mistaken for a new one
            msg.t_arrived = perf_counter()
            if msg.tag.startswith(SYNCHRONOUS):  # only a synchronous send pays for the parse
                number, nul, tag = msg.tag[len(SYNCHRONOUS):].partition("\x00")
                if nul and number.isdigit():
                    msg.tag, msg.synchronous = tag, int(number)
            self._queues[(msg.src, msg.epoch, msg.collective_id, msg.tag)].append(msg)
            if msg.signature is not None:
                self._signatures[(msg.epoch, msg.collective_id)].setdefault(msg.src, msg.signature)
            if self._sleeping:
                self._cond.notify_all()

    def take(self, src: int, tag: str, epoch: int, collective_id: int,
             signature: Signature | None, deadline: float, pump=None) -> Message:
        """Wait for the next message from `src` with `tag` in this collective,
        or raise why it can't come.

        `pump(seconds)`, if given, is how this thread waits: it reads from the transport itself
        (at most that long) instead of sleeping until another thread delivers.
        """
        key = (src, epoch, collective_id, tag)
        awaited = src if signature is not None else None  # in a collective: the Cluster follows
        with self._lock:
            while True:
                if self._aborted is not None:
                    aborted = copy.copy(self._aborted)
                    aborted.waiting_for = awaited
                    raise aborted
                if signature is not None:
                    self._check_agreement(epoch, collective_id, signature)
                queue = self._queues.get(key)
                if queue:
                    msg = queue.popleft()
                    if not queue:
                        del self._queues[key]
                    return msg
                if src in self._failed:
                    raise RankFailure(f"rank {self.rank} cannot receive {tag!r} from rank {src}: "
                                      f"{self._failed[src]}", ranks=(src,), waiting_for=awaited)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    call = str(signature) if signature else ""
                    what = f"in {call}" if call else "(plain recv)"
                    raise CollectiveTimeout(
                        f"rank {self.rank} waited past its deadline for {tag!r} "
                        f"from rank {src} {what}; "
                        f"is rank {src} stuck, or did it call something else?", ranks=(src,),
                        waiting_for=awaited, call=call)
                if pump is None:
                    self._sleeping += 1
                    try:
                        self._cond.wait(remaining)
                    finally:
                        self._sleeping -= 1
                    continue
                self._lock.release()
                try:
                    pump(min(remaining, PUMP_SLICE))
                finally:
                    self._lock.acquire()

    def _check_agreement(self, epoch: int, collective_id: int, mine: Signature) -> None:
        for src, theirs in self._signatures.get((epoch, collective_id), {}).items():
            if theirs != mine:
                raise CollectiveMismatch(
                    f"rank {src} called {theirs} but rank {self.rank} called {mine}. Every rank "
                    f"must call the same collective with the same shape, dtype, op and algorithm.",
                    ranks=(src, self.rank))

    def peer_failed(self, src: int, reason: str) -> None:
        """Mark a peer as gone: waits on it raise RankFailure instead of timing out."""
        with self._lock:
            self._failed.setdefault(src, reason)
            self._cond.notify_all()

    def trouble(self, src: int, what: str) -> CollectiveError | None:
        """Why a wait on `src` (`what`, e.g. "its signal") must stop now: this rank's abort, or
        `src` gone; None if neither (a wait outside the mailbox, comm.window, asks this)."""
        with self._lock:
            if self._aborted is not None:
                aborted = copy.copy(self._aborted)
                aborted.waiting_for = src
                return aborted
            if src in self._failed:
                return RankFailure(f"rank {self.rank} cannot wait for {what} from rank {src}: "
                                   f"{self._failed[src]}", ranks=(src,), waiting_for=src)
            return None

    def abort(self, error: CollectiveError) -> None:
        """Make every current and future wait raise `error` until the next `reset`."""
        with self._lock:
            self._aborted = error
            self._cond.notify_all()

    def reset(self, epoch: int) -> None:
        """Start a new run: forget older messages and any abort."""
        with self._lock:
            self._epoch, self._aborted = epoch, None
            for key in [k for k in self._queues if k[1] < epoch]:
                del self._queues[key]
            for key in [k for k in self._signatures if k[0] < epoch]:
                del self._signatures[key]

    def discard_collectives_before(self, epoch: int, collective_id: int) -> None:
        """Drop leftovers of collectives this rank has finished or abandoned
        (plain messages stay)."""
        with self._lock:
            for key in [k for k in self._queues
                        if k[1] == epoch and earlier_in_space(k[2], collective_id)]:
                del self._queues[key]
            for key in [k for k in self._signatures
                        if k[0] == epoch and earlier_in_space(k[1], collective_id)]:
                del self._signatures[key]

    def pending(self) -> int:
        """How many messages wait unreceived (for tests and leak checks)."""
        with self._lock:
            return sum(len(q) for q in self._queues.values())
