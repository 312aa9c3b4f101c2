"""Non-blocking collectives: `iallreduce`, `ireduce_scatter`, `iall_gather` return a request at
once; `request.wait()` returns the result. Introduced in lessons/12_overlap.

Each rank gets one communication thread, which runs the requests in the order they were issued —
as NCCL runs collectives in stream order, MPI's `MPI_Iallreduce` progresses them, and DeepSpeed's
`overlap_comm` and PyTorch DDP's reducer hand them to a side stream or thread. Every rank must
issue the same collectives in the same order, as with the blocking calls. A blocking collective
called while requests are pending first waits for them, so the two never run at once on one rank.
Point-to-point messages of other threads meanwhile are their own: each collective call's state
(signature, tag space) belongs to that call (comm.calls), never to the communicator.

Nothing waits forever: every message the thread waits for has the communicator's deadline, so a
request finishes or fails; a dead rank fails `wait()` with RankFailure on every survivor.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from ..comm.errors import CollectiveTimeout
from ..comm.progress import Progress
from ..comm.request import check_timeout
from .blocking import all_gather, allreduce, reduce_scatter


class CollectiveRequest:
    """A collective in flight: `wait()` for its result (or its error); `done()` without waiting.
    `t_issued`, `t_start`, `t_end` (time.perf_counter) are when it was issued, ran, finished."""

    def __init__(self, progress, name: str, run, args, comm=None):
        # it runs on `comm` (a Group's request on the group), default the thread's own communicator
        self.comm = progress.comm if comm is None else comm
        self.name, self._run, self._args = name, run, args
        self._progress = progress  # the thread that runs it (the comm's may be gone by wait)
        self.nbytes = int(getattr(args[0], "nbytes", 0)) if args else 0
        self.t_issued, self.t_start, self.t_end = time.perf_counter(), None, None
        self._done, self._result, self._error = threading.Event(), None, None
        self._heard = False  # someone has waited for it (or been told of its error)

    def __repr__(self) -> str:
        state = "done" if self.done() else "running" if self.t_start else "queued"
        return f"CollectiveRequest({self.name}, {self.nbytes} bytes, {state})"

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> np.ndarray:
        """The result; raises the collective's own error (RankFailure, CollectiveMismatch, ...).

        Without `timeout` it waits while the collective makes progress, which every message's
        deadline bounds; with one, CollectiveTimeout after that many seconds."""
        if timeout is not None:
            check_timeout(self.comm.rank, timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done.wait(0.1):
            if not self._progress.thread.is_alive():
                raise RuntimeError(f"rank {self.comm.rank}: the communication thread has stopped")
            if deadline is not None and time.monotonic() > deadline:
                raise CollectiveTimeout(f"rank {self.comm.rank}: {self.name} not finished "
                                        f"within {timeout:g} s ({self!r})")
        self._heard = True
        if self._error is not None:
            raise self._error
        return self._result

    def settle(self) -> None:
        """Wait until it has run (every message's deadline bounds this), taking nothing."""
        while not self._done.wait(0.1) and self._progress.thread.is_alive():
            pass

    def unwaited_error(self, peek: bool = False):
        """Its error, if it failed and nobody waited for it; then it counts as heard (unless
        `peek`)."""
        if not self.done() or self._heard or self._error is None:
            return None
        if not peek:
            self._heard = True
            if hasattr(self._error, "add_note"):  # Python 3.11+
                self._error.add_note(f"raised by {self.name}, a non-blocking collective nobody "
                                     f"waited for, on rank {self._progress.comm.rank}")
        return self._error

    def execute(self) -> None:
        """Run it (on the communication thread), keeping its result or its error."""
        self.t_start = time.perf_counter()
        try:
            self._result = self._run(self.comm, *self._args)
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits
            self._error = e
        finally:
            self.t_end = time.perf_counter()
            self._done.set()


def progress_of(comm) -> Progress:
    """The rank's communication thread (comm.progress.Progress), started on first use."""
    return comm.progress()


def _issue(comm, name: str, run, *args) -> CollectiveRequest:
    progress = progress_of(comm)
    return progress.submit(CollectiveRequest(progress, name, run, args, comm))


def iallreduce(comm, x, op: str = "sum", algorithm: str = "ring") -> CollectiveRequest:
    """Start `allreduce(comm, x, op, algorithm)`; x is copied now, so you may change it after."""
    return _issue(comm, f"allreduce/{algorithm}",
                  lambda c, a: allreduce(c, a, op, algorithm), np.array(x))


def ireduce_scatter(comm, x, op: str = "sum", algorithm: str = "ring") -> CollectiveRequest:
    """Start `reduce_scatter(comm, x, op, algorithm)` (x copied now)."""
    return _issue(comm, "reduce_scatter", lambda c, a: reduce_scatter(c, a, op, algorithm),
                  np.array(x))


def iall_gather(comm, x, algorithm: str = "ring") -> CollectiveRequest:
    """Start `all_gather(comm, x, algorithm)` (x copied now)."""
    return _issue(comm, "all_gather", lambda c, a: all_gather(c, a, algorithm), np.array(x))


def wait_all(requests) -> list:
    """Every request's result, in order (the first error raised once all have finished)."""
    results, first = [], None
    for request in requests:
        try:
            results.append(request.wait())
        except Exception as e:  # noqa: BLE001 - the first one is raised below
            results.append(None)
            first = first or e
    if first is not None:
        raise first
    return results
