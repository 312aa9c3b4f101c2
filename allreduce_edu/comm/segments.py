"""Shared-memory segments for the shm transport: a sender's pool, and a receiver's leases on them.

A segment is a `memfd`: memory with no name in any file system. Its file descriptor travels to the
one peer that reads it over their Unix socket (SCM_RIGHTS), both sides map it, both close the
descriptor. Nothing is ever left behind: the kernel frees the memory once the last mapping goes,
whether the ranks closed normally, were SIGKILLed, or their parent was. (POSIX shared memory in
/dev/shm, which `multiprocessing.shared_memory` uses, outlives a SIGKILLed owner.)

The receiver reduces straight from the sender's segment: `recv` returns an array *in* the segment
(a lease), and the segment goes back to the sender when the last view of that array is dropped.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import threading

import numpy as np

MIN_SEGMENT = 1 << 20  # segment sizes are powers of two from 1 MiB
POOL_BYTES = 256 << 20  # at most this much shared memory per (sender, receiver) pair
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
NAME = "allreduce-edu"  # memfds show as /memfd:allreduce-edu ... in /proc/PID/fd (for leak tests)


def size_class(nbytes: int) -> int:
    """The segment size a message of `nbytes` goes into."""
    return max(MIN_SEGMENT, 1 << (max(nbytes, 1) - 1).bit_length())


class Segment:
    """One memfd mapped into this process: `id` names it between the two ranks."""

    def __init__(self, id: int, size: int, fd: int | None = None):
        self.id, self.size = id, size
        owner = fd is None
        if owner:
            fd = os.memfd_create(f"{NAME} segment {id}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, size)
            # sealed: nobody can shrink it under the peer's mapping (a read would SIGBUS)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
        try:
            if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & SEALS != SEALS:
                raise ValueError(f"segment {id} is not a sealed memfd")
            if os.fstat(fd).st_size != size:
                raise ValueError(f"segment {id} is {os.fstat(fd).st_size} bytes, not {size}")
            flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if owner else 0)
            self.map = mmap.mmap(fd, size, flags=flags)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd if owner else None  # the owner keeps it until the peer has it
        if not owner:
            os.close(fd)
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.bytes = np.frombuffer(self.map, np.uint8)

    def handed_over(self) -> None:
        """The peer has the descriptor: the mapping is all this process needs."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Pool:
    """A sender's segments towards one peer: `acquire` one for a message, `release` it when the
    peer says it is done with it. Segments are kept for the link's life (reused, never faulted in
    twice). Bounded by `limit` bytes; past that, `acquire` returns None and the message travels
    inline on the socket instead (slower, never stuck)."""

    def __init__(self, limit: int = POOL_BYTES):
        self.limit, self.total = limit, 0
        self._lock = threading.Lock()
        self._free: dict[int, list[Segment]] = {}
        self._all: dict[int, Segment] = {}
        self._out: set[int] = set()  # acquired: being filled, or held by the peer
        self._next = 1

    def acquire(self, nbytes: int) -> Segment | None:
        """A free segment that holds `nbytes` (its `fd` is set while the peer has not got it)."""
        size = size_class(nbytes)
        with self._lock:
            if self._free.get(size):
                segment = self._free[size].pop()
            elif self.total + size > self.limit:
                return None
            else:
                segment = Segment(self._next, size)
                self._all[segment.id] = segment
                self._next, self.total = self._next + 1, self.total + size
            self._out.add(segment.id)
            return segment

    def release(self, id: int) -> bool:
        """The peer is done with segment `id`; False if it does not hold it (a broken peer:
        never sent, or released twice)."""
        with self._lock:
            if id not in self._out:
                return False
            self._out.discard(id)
            segment = self._all[id]
            self._free.setdefault(segment.size, []).append(segment)
            return True

    def forget(self, segment: Segment) -> None:
        """A segment the peer never received (its send failed): drop it."""
        with self._lock:
            self._all.pop(segment.id, None)
            self._out.discard(segment.id)
            self.total -= segment.size
        segment.handed_over()


class Lease:
    """A received message's array, living in the sender's segment; NumPy views of it keep it
    (`np.asarray(lease)` has the lease as its base), and the last one to go gives it back."""

    def __init__(self, segment: Segment, dtype: np.dtype, shape: tuple, give_back):
        self.segment, self._give_back = segment, give_back
        self.__array_interface__ = {"shape": shape, "typestr": dtype.str, "version": 3,
                                    "data": (segment.address, False)}

    def __del__(self):
        try:
            self._give_back(self.segment.id)
        except Exception:  # noqa: BLE001 - a peer already gone needs nothing back
            pass


class Outbox:
    """An array to fill in one of a sender's segments (`Communicator.send_buffer`): sending it
    copies nothing. Dropped unsent, its segment goes back to the pool."""

    def __init__(self, link, segment: Segment, dtype: np.dtype, shape: tuple):
        self.link, self.segment, self.sent = link, segment, False
        self.nbytes = dtype.itemsize * int(np.prod(shape))
        self.__array_interface__ = {"shape": shape, "typestr": dtype.str, "version": 3,
                                    "data": (segment.address, False)}

    @staticmethod
    def of(array: np.ndarray):
        """The Outbox `array` is, whole (not a slice or a reshaped view of part of it), or None."""
        base = array.base
        while isinstance(base, np.ndarray):
            base = base.base
        if (isinstance(base, Outbox) and array.nbytes == base.nbytes and array.flags.c_contiguous
                and array.__array_interface__["data"][0] == base.segment.address):
            return base
        return None

    def __del__(self):
        if not self.sent:
            self.link.pool.release(self.segment.id)
