"""Shared-memory segments for the shm transport: a sender's pool, and a receiver's leases on them.

What a segment is depends on the backend (backend.py: a memfd on Linux, named shared memory
elsewhere); the pool, the leases and the outboxes are the same for both. The receiver reduces
straight from the sender's segment: `recv` returns an array *in* the segment (a lease), and the
segment goes back to the sender when the last view of that array is dropped.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import numpy as np

from ...wire import WireError, check_header

MIN_SEGMENT = 1 << 20  # segment sizes are powers of two from 1 MiB
POOL_BYTES = 256 << 20  # at most this much shared memory per (sender, receiver) pair


def size_class(nbytes: int) -> int:
    """The segment size a message of `nbytes` goes into."""
    return max(MIN_SEGMENT, 1 << (max(nbytes, 1) - 1).bit_length())


class Pool:
    """A sender's segments towards one peer: `acquire` one for a message, `release` it when the
    peer says it is done with it. Segments are kept for the link's life (reused, never faulted in
    twice). Bounded by `limit` bytes; past that, `acquire` returns None and the message travels
    inline on the socket instead (slower, never stuck)."""

    def __init__(self, new_segment: Callable, limit: int = POOL_BYTES):
        self.new_segment, self.limit, self.total = new_segment, limit, 0
        self._lock = threading.Lock()
        self._free: dict[int, list] = {}
        self._all: dict[int, object] = {}  # id -> segment
        self._out: set[int] = set()  # acquired: being filled, or held by the peer
        self._next = 1

    def acquire(self, nbytes: int) -> object | None:
        """A free segment that holds `nbytes` (its `handle` is set while the peer has not got
        it)."""
        size = size_class(nbytes)
        with self._lock:
            if self._free.get(size):
                segment = self._free[size].pop()
            elif self.total + size > self.limit:
                return None
            else:
                try:
                    segment = self.new_segment(self._next, size)
                except OSError:  # no room for shared memory (a full /dev/shm): inline instead
                    return None
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

    def forget(self, segment) -> None:
        """A segment the peer never received (its send failed): drop it."""
        with self._lock:
            self._all.pop(segment.id, None)
            self._out.discard(segment.id)
            self.total -= segment.size
        segment.handed_over()
        segment.unlink()

    def close(self) -> None:
        """The link is closing: remove the names of segments never sent. A sent one is the
        peer's to map and unlink, even after this close (its message may still be unread); what
        it never maps, its Cluster sweeps."""
        with self._lock:
            for segment in self._all.values():
                if segment.handle is not None:
                    segment.handed_over()
                    segment.unlink()


class Lease:
    """A received message's array, living in the sender's segment; NumPy views of it keep it
    (`np.asarray(lease)` has the lease as its base), and the last one to go gives it back."""

    def __init__(self, segment, dtype: np.dtype, shape: tuple, give_back):
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

    def __init__(self, link, segment, dtype: np.dtype, shape: tuple):
        self.link, self.segment, self.sent = link, segment, False
        self.nbytes = dtype.itemsize * math.prod(shape)
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


# --- a receiver's side of a segment frame (kinds.py calls it) ----------------------------------
def lease(link, h, handle) -> np.ndarray:
    """The array a segment frame (header `h`) describes, in the sender's segment (checked first);
    maps a new segment from `handle`, which it uses up."""
    try:
        check_header(h, link.comm.world_size, link.peer, link.comm.max_message_bytes)
        if h.offset or h.length:
            raise WireError("a segment frame carries data of its own")
        link.assembler.take_seq(h)
    except WireError:
        if handle is not None:
            link.backend.discard(handle)
        raise
    if handle is not None:
        _map(link, h, handle)
    segment = link.theirs.get(h.segment)
    if segment is None or segment.size != h.segment_bytes:
        raise WireError(f"unknown segment {h.segment} ({h.segment_bytes} bytes)")
    if h.segment in link.leased:
        raise WireError(f"segment {h.segment} reused while rank {link.comm.rank} holds it")
    link.leased.add(h.segment)
    return np.asarray(Lease(segment, np.dtype(h.dtype), tuple(h.shape), link.give_back))


def _map(link, h, handle) -> None:
    """Map the peer's new segment `h.segment` from `handle` (used up, mapped or not)."""
    size = h.segment_bytes
    if (h.segment in link.theirs or size < MIN_SEGMENT or size & (size - 1)
            or sum(s.size for s in link.theirs.values()) + size > POOL_BYTES):
        link.backend.discard(handle)
        raise WireError(f"segment {h.segment} of {size} bytes: not a new segment "
                        f"within the {POOL_BYTES}-byte limit")
    try:
        link.theirs[h.segment] = link.backend.open_segment(h.segment, size, handle)
    except (OSError, ValueError) as e:
        raise WireError(f"segment {h.segment} cannot be mapped: {e}") from None
