"""What an algorithm may use of a communicator: the one contract every communicator-shaped object
keeps (transports' Communicator, comm.group.Group, the checkers' Spy). Introduced in lessons/01.

An algorithm (allreduce_edu.collectives) reads `rank`, `world_size`, `ranks_per_node` and, to plan
on them, the emulated `links` its messages cross (the double binary tree's order), moves
arrays with `send`, `recv`, `isend` and `sendrecv`, may `barrier`, fills arrays from `send_buffer`,
and marks its messages as one collective with `with comm.collective(...)`; a non-blocking
collective hands itself to `comm.progress()`, the rank's communication thread. Nothing else: not
the trace, the timeout or the transport. A class that subclasses `Comm` and gives the first seven
gets the last four as plain defaults (an empty array; a dissemination barrier; no signature checks;
no communication thread).

Under a process transport's communicator, each peer is reached through a `Link` (gloo's
`transport::Pair`): a gRPC stream (transports/grpc/link.py, PeerLink) or shared memory
(comm.transports.shm.link.ShmLink, on either backend of comm/transports/shm/backend.py).
"""

from __future__ import annotations

import contextlib
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Comm(Protocol):
    """The communicator an algorithm sees (typing.Protocol: structural, so any object with these
    members is one; subclass it explicitly for the defaults)."""

    rank: int
    world_size: int
    ranks_per_node: int | None  # consecutive ranks that share a node; None: unknown (flat)
    links = None  # the emulated links (model.links.Links) its messages cross; None: none

    def send(self, dst: int, array, tag: str, *, step: int = -1, chunk=None) -> None:
        """Send `array` to `dst`; returns once your array is free again (eager)."""
        ...

    def isend(self, dst: int, array, tag: str, *, step: int = -1, chunk=None):
        """Start sending `array` to `dst`; returns something to `wait()` on."""
        ...

    def recv(self, src: int, tag: str, timeout: float | None = None) -> np.ndarray:
        """The next array `src` sent with `tag`; raises instead of waiting forever."""
        ...

    def sendrecv(self, dst: int, array, src: int, tag: str, *, step: int = -1, chunk=None,
                 timeout: float | None = None) -> np.ndarray:
        """Send to `dst` while receiving from `src` (full duplex: never deadlocks)."""
        ...

    def send_buffer(self, dst: int, shape, dtype) -> np.ndarray:
        """An empty array to fill and then send to `dst` (plain: np.empty; the shm transport: a
        shared segment, sent uncopied)."""
        return np.empty(shape, dtype)

    def barrier(self) -> None:
        """Return once every rank has called barrier (dissemination: ⌈log2 N⌉ rounds of empty
        messages)."""
        with self.collective("barrier"):
            empty = np.empty(0, np.uint8)
            distance, step = 1, 0
            while distance < self.world_size:
                # step s: tell rank + 2^s you are here, hear from rank - 2^s
                self.sendrecv((self.rank + distance) % self.world_size, empty,
                              (self.rank - distance) % self.world_size, "barrier", step=step)
                distance, step = distance * 2, step + 1

    def collective(self, name: str, *, algorithm: str = "", op: str = "", dtype="", shape=(),
                   root: int = -1, space: int = 0) -> contextlib.AbstractContextManager:
        """A context for the messages of one collective call (plain: none, so no checks; a
        Communicator yields the call's own comm.calls.CollectiveCall, numbered in `space`: 0 the
        world's calls, a Group's its own)."""
        return contextlib.nullcontext()

    def progress(self):
        """The rank's communication thread (comm.progress.Progress), where non-blocking
        collectives run in issue order (plain: none, so they cannot be issued)."""
        raise NotImplementedError(f"{type(self).__name__} has no communication thread: "
                                  "non-blocking collectives need a transport's Communicator "
                                  "(or a Group of one)")


@runtime_checkable
class Link(Protocol):
    """One peer as a communicator reaches it (the GrpcCommunicator's `routes`, peer -> Link)."""

    via: str  # what the trace says carried its messages: "grpc", "shm"
    pump = None  # pump(seconds): a recv from this peer reads on its own thread; None: never

    def send(self, msg, chunk):
        """Post one message (comm.mailbox.Message); returns its Request (comm.base)."""
        ...

    def send_buffer(self, shape, dtype) -> np.ndarray:
        """An array to fill and send through this link (where it can: uncopied)."""
        ...

    def receiving(self) -> contextlib.AbstractContextManager:
        """Held while a recv from this peer waits."""
        ...

    def abort(self, error) -> None:
        """Fail what is in flight with `error` (a collective was aborted)."""
        ...

    def close(self) -> None:
        ...
