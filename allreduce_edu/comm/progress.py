"""A rank's communication thread: runs the non-blocking collectives' requests in issue order
(allreduce_edu.collectives.nonblocking). Introduced in lessons/12_overlap.

It lives here, beside the Communicator that owns it, so that a blocking collective can wait for the
requests still pending and a run's end can drain them without anything below reaching up.
A request is anything with `execute()` (run it, keeping its result or error), `wait()`, `done()`,
`settle()` (wait until it has run, taking nothing) and `unwaited_error()` (its error, if it failed
and nobody waited for it). No failure vanishes: one that nobody waited for is raised by the next
drain, which the next blocking collective and the end of every Cluster run call, as MPI and NCCL
report an unwaited request's error at the next call.
"""

from __future__ import annotations

import queue
import threading


class Progress:
    """A rank's communication thread and its queue of requests, in issue order
    (`comm`: the communicator whose requests it runs)."""

    def __init__(self, comm):
        self.comm = comm
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: list = []
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, daemon=True,
                                       name=f"rank{comm.rank}-collectives")
        self.thread.start()

    def submit(self, request):
        with self._lock:  # finished ones go, unless they failed and nobody has heard of it yet
            self._pending = [r for r in self._pending
                             if not r.done() or r.unwaited_error(peek=True) is not None]
            self._pending.append(request)
        self._queue.put(request)
        return request

    def drain(self, report: bool = True) -> None:
        """Wait for every pending request; then raise the first error that nobody waited for (each
        is raised once; `report=False`: only count them as heard, when the caller's own error
        already says what went wrong). A request's own wait() raises its error as before."""
        with self._lock:
            pending, self._pending = list(self._pending), []
        for request in pending:
            request.settle()
        unheard = [e for r in pending if (e := r.unwaited_error()) is not None]
        if unheard and report:
            for other in unheard[1:]:  # one is raised; the others are named in it, not lost
                if hasattr(unheard[0], "add_note") and other is not unheard[0]:
                    unheard[0].add_note(f"also: {type(other).__name__}: {other}")
            raise unheard[0]

    def _loop(self) -> None:
        while (request := self._queue.get()) is not None:
            request.execute()

    def close(self) -> None:
        """Finish what is pending, then end the thread."""
        self.drain(report=False)
        self._queue.put(None)
        self.thread.join(5)
