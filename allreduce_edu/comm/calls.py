"""One collective call's state, owned by that call: its signature, its tag space (the collective
id its messages carry) and how long each of its waits may take. Introduced in lessons/04.

A group (comm.group) numbers its own calls in a space of its own: a collective that only some ranks
call must not put the others' numbering out of step. A message carries `space << 32 | number`.

A rank's threads each have their own current call: the communication thread's `iallreduce` and the
main thread's point-to-point never share one (as MPI and torch.distributed allow). A thread outside
any collective has none: its messages are plain ones (collective id 0, no signature).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

from .mailbox import SPACE_BITS, Signature


@dataclass
class CollectiveCall:
    """A collective in progress on one thread of one rank; nested collectives (ring all-reduce
    calling reduce-scatter) belong to the outermost call, which `depth` counts."""

    signature: Signature
    collective_id: int  # the tag space: messages of this call carry it, and only its own match
    timeout: float  # how long each wait of this call may take, in seconds
    depth: int = 1

    @functools.cached_property
    def label(self) -> str:
        """"allreduce/ring": what a trace event says it belonged to (made once a call: every
        message of the call reads it)."""
        return f"{self.signature.collective}/{self.signature.algorithm}".rstrip("/")


class _Current(threading.local):
    """Each thread's current call: None until it opens one (a class default, so that looking it
    up on a thread that never opened one costs no AttributeError: 0.3 µs a message here)."""

    call: CollectiveCall | None = None


class Calls:
    """Each thread's current call on one communicator, and the numbering every rank agrees on."""

    def __init__(self):
        self._local = _Current()
        self._lock = threading.Lock()
        self._last: dict[int, int] = {}  # space -> the last number given in it

    def current(self) -> CollectiveCall | None:
        """The calling thread's collective, or None (plain point-to-point)."""
        return self._local.call

    def open(self, signature: Signature, timeout: float, space: int = 0) -> CollectiveCall:
        """Start a new call on this thread (ranks number their calls alike: in the order issued,
        each space on its own; 0 is the world's)."""
        with self._lock:
            self._last[space] = number = self._last.get(space, 0) + 1
            call = CollectiveCall(signature, space << SPACE_BITS | number, timeout)
        self._local.call = call
        return call

    def close(self) -> None:
        self._local.call = None

    def reset(self) -> None:
        """A fresh run: numbering starts again (every thread's call is over)."""
        with self._lock:
            self._last.clear()
        self._local = _Current()
