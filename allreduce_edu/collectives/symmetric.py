"""One-shot and two-shot all-reduce on symmetric windows (comm.window). Introduced in lessons/18.

No messages: every rank writes its input into its own window, signals every peer, and reads what
it needs straight from theirs (NCCL's symmetric kernels since 2.27, torch's
`symm_mem.one_shot_all_reduce` / `two_shot_all_reduce_`, vLLM's custom all-reduce).

- one-shot: every rank reads every peer's whole buffer and reduces all N itself. One round of
  signals; (N−1)·S bytes read per rank. Wins while S is small: latency is all there is.
- two-shot: rank r reduces slice r from every window (reduce-scatter), publishes it, and every rank
  reads each reduced slice from its owner (all-gather). Two rounds; 2(N−1)/N·S bytes per rank.

Both add the N contributions in rank order on every rank, so every rank holds identical bits.
The scratch window is the communicator's, kept between calls of one run (a run that failed part
way leaves signal counts out of step: the next run opens a new one) and grown when a call needs
more; it has two halves, used by alternate calls, so a rank may start the next call while a slow
peer still reads the last one (it cannot be two calls behind: each call waits for every peer's
signal). Each half starts with a stamp of the call (what it reduces: shape, dtype, op, and the
call's number), which every reader checks, so ranks that called differently, or are out of step,
fail with CollectiveMismatch, not a wrong sum.
A reader's read of a peer's window is a trace event from that peer to the reader (what replay and
the animations draw, as for a message).
"""

from __future__ import annotations

import functools
import time
import weakref
import zlib

import numpy as np

from ..comm.errors import CollectiveMismatch
from ..comm.window import rendezvous
from ..model import costmodel
from ..trace import Event
from .registry import allreduce_algorithm, reduce_into, split_bounds

HEADER = 64  # a half's first bytes: the call's stamp
MIN_CAPACITY = 64 << 10  # the smallest region a scratch window is made with
_SCRATCH: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # comm -> Scratch


class Scratch:
    """A communicator's scratch window, how many calls it has served, the run it belongs to, and
    the views its calls have asked for (made once: NumPy takes microseconds to make each)."""

    def __init__(self, window, epoch: int):
        self.window, self.calls, self.epoch, self.views = window, 0, epoch, {}


def scratch(comm, nbytes: int, regions: int) -> tuple[Scratch, int]:
    """The communicator's Scratch, its window with room for `regions` × `nbytes` in each half, and
    the byte offset of this call's half (every rank of a collective asks the same: ranks that asked
    for a different size would open windows of different sizes, which rendezvous refuses)."""
    held = _SCRATCH.get(comm)
    epoch = getattr(comm, "epoch", 0)  # a new run starts from fresh counts on every rank
    if held is None or held.epoch != epoch or held.window.nbytes < 2 * (HEADER + regions * nbytes):
        capacity = max(MIN_CAPACITY, 1 << (max(regions * nbytes, 1) - 1).bit_length())
        if held is not None:
            held.window.close()
        _SCRATCH.pop(comm, None)
        held = _SCRATCH[comm] = Scratch(rendezvous(comm, 2 * (HEADER + capacity)), epoch)
    held.calls += 1
    return held, (held.calls % 2) * (held.window.nbytes // 2)


@functools.lru_cache(maxsize=256)
def _stamp_of(label: str, op: str, dtype: np.dtype, shape: tuple, nbytes: int) -> tuple[int, int]:
    return zlib.crc32(f"{label} {op} {dtype} {shape}".encode()), nbytes  # str(dtype): 9 µs here


def _stamp(call, x: np.ndarray, number: int) -> tuple[int, int]:
    """What this call reduces, and its number among the window's calls, as two numbers every
    reader compares with its own (data left from another call never passes)."""
    crc, nbytes = _stamp_of(call.label, call.signature.op, x.dtype, x.shape, x.nbytes)
    return crc ^ (number << 32), nbytes


def _check_stamp(comm, call, theirs: np.ndarray, src: int, stamp: tuple[int, int]) -> None:
    if (int(theirs[0]), int(theirs[1])) != stamp:
        raise CollectiveMismatch(
            f"rank {src} called a different all-reduce on the window than rank {comm.rank} "
            f"({call.signature}; {int(theirs[1])} bytes against {stamp[1]}): every rank must "
            f"call it with the same shape, dtype and op", ranks=(src, comm.rank))


def _views(held: Scratch, half: int, x: np.ndarray,
           offset: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each rank's stamp and, from `offset`, an array like `x` in this call's half of its window
    (checked once, when first asked for: the loops below index them directly)."""
    key = (half, offset, x.dtype, x.shape)
    views = held.views.get(key)
    if views is None:
        window = held.window
        window.get_buffer(window.rank, x.shape, x.dtype, half + HEADER + offset)  # fits, or raises
        start = half + HEADER + offset
        views = [(data[half:half + 16].view(np.uint64),
                  data[start:start + x.nbytes].view(x.dtype).reshape(x.shape))
                 for data in window.data]
        if len(held.views) >= 64:  # calls of many shapes: start the cache again
            held.views.clear()
        held.views[key] = views
    return views


def _publish(comm, window, mine, x: np.ndarray, stamp: tuple[int, int]) -> None:
    """My input into my window, stamped; then a signal to every peer."""
    mine[0][:] = stamp
    mine[1][...] = x
    for k in range(1, comm.world_size):
        window.put_signal((comm.rank + k) % comm.world_size)


def _read(comm, call, src: int, tag: str, nbytes: int, chunk, t_start: float) -> None:
    """Record rank `src`'s bytes read by this rank as a trace event (src -> this rank)."""
    if src != comm.rank:
        comm.trace.record(Event(src, comm.rank, tag, 0, nbytes, t_start, time.perf_counter(),
                                chunk, call.label, "window"))


@allreduce_algorithm("one_shot", layout="circle", phases=("one_shot",), cost=costmodel.one_shot,
                     colour="#56B4E9", needs="windows")
def allreduce_one_shot(comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """Every rank reads every peer's whole buffer from its window and reduces all N (one round)."""
    if comm.world_size == 1:
        return x.copy()
    held, half = scratch(comm, x.nbytes, 1)
    window, call = held.window, comm.current_call()
    stamp, views = _stamp(call, x, held.calls), _views(held, half, x)
    _publish(comm, window, views[comm.rank], x, stamp)
    acc = None
    for src, (stamped, theirs) in enumerate(views):  # in rank order: every rank adds alike
        if src != comm.rank:
            window.wait_signal(src)
            _check_stamp(comm, call, stamped, src, stamp)
        t_start = time.perf_counter()
        acc = theirs.copy() if acc is None else reduce_into(acc, theirs, op)
        _read(comm, call, src, "one_shot", x.nbytes, None, t_start)
    return acc


@allreduce_algorithm("two_shot", layout="ring", phases=("reduce_scatter", "all_gather"),
                     cost=costmodel.two_shot, colour="#009E73", needs="windows")
def allreduce_two_shot(comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """Rank r reduces slice r from every window, publishes it, and reads every other reduced slice
    from its owner (two rounds)."""
    n, r = comm.world_size, comm.rank
    if n == 1:
        return x.copy()
    held, half = scratch(comm, x.nbytes, 2)
    window, call = held.window, comm.current_call()
    flat = x.reshape(-1)
    stamp, inputs = _stamp(call, x, held.calls), _views(held, half, flat)
    reduced = [v for _, v in _views(held, half, flat, x.nbytes)]  # region B, after region A
    _publish(comm, window, inputs[r], flat, stamp)
    bounds, item = split_bounds(x.size, n), x.itemsize
    lo, hi = bounds[r], bounds[r + 1]
    acc = None
    for src, (stamped, theirs) in enumerate(inputs):  # reduce-scatter: slice r of every window
        if src != r:
            window.wait_signal(src)
            _check_stamp(comm, call, stamped, src, stamp)
        t_start = time.perf_counter()
        acc = theirs[lo:hi].copy() if acc is None else reduce_into(acc, theirs[lo:hi], op)
        _read(comm, call, src, "reduce_scatter", acc.nbytes, (r, r + 1), t_start)
    reduced[r][lo:hi] = acc
    for k in range(1, n):
        window.put_signal((r + k) % n)
    out = np.empty(x.size, x.dtype)
    for k in range(n):  # all-gather: each reduced slice from its owner
        src = (r + k) % n
        if src != r:
            window.wait_signal(src)
        t_start = time.perf_counter()
        a, b = bounds[src], bounds[src + 1]
        out[a:b] = reduced[src][a:b]
        _read(comm, call, src, "all_gather", (b - a) * item, (src, src + 1), t_start)
    return out.reshape(x.shape)
