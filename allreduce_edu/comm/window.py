"""Symmetric memory: a window of the same size on every rank, every rank's mapped by all. Lesson 18.

    win = rendezvous(comm, nbytes)                 # every rank calls it, in the same order
    mine = win.get_buffer(win.rank, (n,), "float32")   # my window, as an array
    theirs = win.get_buffer(peer, (n,), "float32")     # a peer's: read and write it in place
    win.put(dst, array, offset=0)                  # copy into rank dst's window
    win.put_signal(dst, channel=0)                 # tell dst "what I wrote before this is there"
    win.wait_signal(src, channel=0)                # until src signalled me (deadline: comm.timeout)
    win.barrier(channel=0)                         # signal every rank, then wait for every rank

The shape is torch's `SymmetricMemory` (`symm_mem.rendezvous(t, group)`, `get_buffer(rank, sizes,
dtype, storage_offset)`, `put_signal(dst_rank, channel)`, `wait_signal(src_rank, channel)`,
`barrier(channel)`) and NCCL's windows (`ncclCommWindowRegister`, 2.27; `ncclPutSignal`,
`ncclWaitSignal`, 2.29). A transport that can map its peers' memory makes windows
(`comm.open_window`): the shm transport (shared memory; linux and portable backends) and the
thread transport; gRPC between machines cannot, and `rendezvous` says so.

A window's first bytes are its signal pad, one 8-byte word per (channel, sender), and after it one
word more, the size its rank asked for (ranks that ask for different sizes get CollectiveMismatch);
`pad_bytes` covers both, rounded up to a cache line, and the data starts after. A signal is not a
flag set and cleared but a count: `put_signal` writes "this is my k-th signal to you on this
channel", `wait_signal` waits for the count it expects next. One writer per word, nothing to
reset, and a word left from an earlier round can never pass for a new one (sequence numbers
against reuse: lesson 18 shows the stale flag they prevent). A store of the count is one aligned
8-byte store after a memory fence, so everything written before it is visible before it, on
x86 and on ARM (Apple's) alike (a Numba kernel: Python has no fence of its own).

A wait spins a little (a signal usually comes within microseconds), giving its core away at every
look (sched_yield) to any rank that is waiting for one, then naps, longer and longer up to NAP_MAX:
four ranks share two cores here, and a waiter that kept its core would starve the rank it waits
for. Between naps it asks the mailbox whether the peer is gone or the call aborted (RankFailure,
CollectiveAborted) and checks its deadline (CollectiveTimeout).
"""

from __future__ import annotations

import math
import os
import time

import numpy as np

from .dtypes import as_shape
from .errors import CollectiveError, CollectiveMismatch, CollectiveTimeout
from .request import check_timeout

TRANSPORTS = frozenset({"local", "shm"})  # the transports whose ranks can map each other's memory
CHANNELS = 4  # signal channels per window (torch: as many as its pad holds)
ALIGN = 64  # the data starts on a cache line
MAX_WINDOW_BYTES = 1 << 30  # one window's data, at most (every rank maps every peer's: N times it)
SPIN_S = 300e-6  # how long a wait spins (yielding the core at every look) before its first nap
NAP_MAX = 1e-3  # the longest nap between two looks
YIELD = getattr(os, "sched_yield", lambda: time.sleep(0))  # Windows has no sched_yield


class WindowsUnavailable(CollectiveError):
    """This communicator cannot map its peers' memory (gRPC between machines, an engine)."""


def pad_bytes(world_size: int) -> int:
    """Bytes before a window's data: its signal pad (CHANNELS words per rank) and the size word,
    rounded up to a cache line."""
    return -(-(CHANNELS * world_size + 1) * 8 // ALIGN) * ALIGN


def size_word(buffer: np.ndarray, world_size: int) -> np.ndarray:
    """The word after the signal pad: the window size its rank asked for (segments are sized
    to whole cache lines, so two sizes can map alike; this word tells them apart)."""
    at = CHANNELS * world_size * 8
    return buffer[at:at + 8].view(np.uint64)


def rendezvous(comm, nbytes: int) -> SymmetricMemory:
    """A window of `nbytes` on every rank of `comm`, mapped by all (every rank calls it, in the same
    order, with the same size: a rank that asks for another size gets CollectiveMismatch)."""
    if not isinstance(nbytes, (int, np.integer)) or not 0 <= nbytes <= MAX_WINDOW_BYTES:
        raise ValueError(f"rank {comm.rank}: a window of nbytes={nbytes!r}: it must be a whole "
                         f"number of bytes from 0 to {MAX_WINDOW_BYTES} (1 GiB)")
    opener = getattr(comm, "open_window", None)
    if opener is None:
        raise WindowsUnavailable(
            f"rank {comm.rank}: the {getattr(comm, 'transport', type(comm).__name__)} transport "
            f"cannot map its peers' memory, so it has no symmetric windows: run on "
            f"Cluster(transport='shm') (every rank on this machine) or on threads")
    total = pad_bytes(comm.world_size) + -(-int(nbytes) // ALIGN) * ALIGN
    number, buffers, settled = opener(total)
    size_word(buffers[comm.rank], comm.world_size)[0] = nbytes  # the barrier's signals publish it
    window = SymmetricMemory(comm, int(nbytes), buffers, number)
    try:
        window.barrier(CHANNELS - 1)  # every rank has mapped every window: names may go
        asked = [int(size_word(b, comm.world_size)[0]) for b in buffers]
        other = next((r for r, size in enumerate(asked) if size != nbytes), None)
        if other is not None:
            raise CollectiveMismatch(f"rank {other} asked for a window of {asked[other]} bytes, "
                                     f"rank {comm.rank} for {nbytes}: every rank must ask for "
                                     f"the same size", ranks=(other, comm.rank))
    except BaseException:
        window.close()
        raise
    finally:
        settled()
    return window


class SymmetricMemory:
    """One window on every rank: `buffers[r]` is rank r's whole window (uint8), mapped here."""

    def __init__(self, comm, nbytes: int, buffers: list[np.ndarray], number: int = 0):
        self.comm, self.rank, self.world_size = comm, comm.rank, comm.world_size
        self.nbytes = nbytes
        self.number = number  # the communicator's count of windows, this one included
        start = pad_bytes(self.world_size)
        self.pads = [b[:CHANNELS * self.world_size * 8].view(np.uint64).reshape(CHANNELS, -1)
                     for b in buffers]
        self.data = [b[start:start + nbytes] for b in buffers]
        # signals I gave each rank, and took from each, per channel (Python ints: a NumPy
        # element's read-modify-write costs a microsecond)
        self.sent = [[0] * CHANNELS for _ in range(self.world_size)]
        self.seen = [[0] * CHANNELS for _ in range(self.world_size)]
        self.store, self.load = _kernels()

    def __repr__(self) -> str:
        return (f"SymmetricMemory(rank={self.rank}, world_size={self.world_size}, "
                f"nbytes={self.nbytes})")

    def get_buffer(self, rank: int, shape, dtype, offset: int = 0) -> np.ndarray:
        """Rank `rank`'s window from byte `offset` as an array of `shape` and `dtype` (a view:
        writing it writes that rank's memory)."""
        self.comm.check_peer(rank, "rank")
        dtype = np.dtype(dtype)
        shape = as_shape(shape)
        count = math.prod(shape)
        if offset < 0 or offset % dtype.itemsize or offset + count * dtype.itemsize > self.nbytes:
            raise ValueError(f"rank {self.rank}: {count} × {dtype} at byte {offset} does not fit "
                             f"a {self.nbytes}-byte window aligned to {dtype.itemsize} bytes")
        return self.data[rank][offset:offset + count * dtype.itemsize].view(dtype).reshape(shape)

    def put(self, dst: int, array, offset: int = 0) -> None:
        """Copy `array` into rank `dst`'s window at byte `offset` (no signal: put_signal does)."""
        array = np.ascontiguousarray(array)
        self.get_buffer(dst, array.shape, array.dtype, offset)[...] = array

    def check_channel(self, channel) -> None:
        if not isinstance(channel, (int, np.integer)) or not 0 <= channel < CHANNELS:
            raise ValueError(f"rank {self.rank}: channel={channel!r}: valid channels are "
                             f"0..{CHANNELS - 1}")

    def put_signal(self, dst: int, channel: int = 0) -> None:
        """Signal rank `dst` on `channel`: everything this rank wrote before is visible first."""
        self.comm.check_peer(dst, "dst")
        self.check_channel(channel)
        sent = self.sent[dst]
        sent[channel] += 1
        self.store(self.pads[dst], channel, self.rank, sent[channel])

    def wait_signal(self, src: int, channel: int = 0, timeout: float | None = None) -> None:
        """Wait until rank `src` has signalled this rank on `channel` once more than it had when
        this rank last waited for it; spin, then nap (module docstring)."""
        self.comm.check_peer(src, "src")
        self.check_channel(channel)
        if timeout is not None:
            check_timeout(self.rank, timeout)
        wanted = self.seen[src][channel] + 1
        if self.load(self.pads[self.rank], channel, src) < wanted:
            self._wait(src, channel, wanted, timeout)
        self.seen[src][channel] = wanted  # only once it came: a wait that failed took nothing

    def _wait(self, src: int, channel: int, wanted: int, timeout: float | None) -> None:
        pad, load = self.pads[self.rank], self.load
        start = time.monotonic()
        deadline = start + (self.comm.timeout if timeout is None else timeout)
        nap = 0.0
        while load(pad, channel, src) < wanted:
            now = time.monotonic()
            if now - start < SPIN_S:
                YIELD()  # a peer waiting for this core gets it; else this returns at once
                continue
            trouble = self.comm.mailbox.trouble(src, f"its signal on channel {channel}")
            if trouble is not None:
                raise trouble
            if now > deadline:
                raise CollectiveTimeout(
                    f"rank {self.rank} waited past its deadline for signal {int(wanted)} on "
                    f"channel {channel} from rank {src} (slot [{channel}, {src}] of its signal pad "
                    f"held {int(load(pad, channel, src))}); is rank {src} stuck, or "
                    f"did it call something else?", ranks=(src,), waiting_for=src)
            time.sleep(nap)
            nap = min(NAP_MAX, nap * 2 or 20e-6)

    def barrier(self, channel: int = 0) -> None:
        """Signal every rank, then wait for every rank's signal."""
        for k in range(1, self.world_size):
            self.put_signal((self.rank + k) % self.world_size, channel)
        for k in range(1, self.world_size):
            self.wait_signal((self.rank - k) % self.world_size, channel)

    def close(self) -> None:
        """Forget the mappings (the memory goes with its last view)."""
        self.pads, self.data = [], []
        self.comm.close_window(self.number)


_KERNELS = None


def _kernels():
    """The two Numba kernels (fence.py), compiled on first use (and cached on disk)."""
    global _KERNELS
    if _KERNELS is None:
        from .fence import load, store
        _KERNELS = store, load
    return _KERNELS
