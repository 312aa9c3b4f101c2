"""A rank's communication thread: runs the non-blocking collectives' requests in issue order
(allreduce_edu.collectives.nonblocking). Introduced in lessons/12_overlap.

It lives here, beside the Communicator that owns it, so that a blocking collective can wait for the
requests still pending and a run's end can drain them without anything below reaching up.
A request is anything with `execute()` (run it, keeping its result or error) and `wait()`.
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
        with self._lock:
            self._pending = [r for r in self._pending if not r.done()] + [request]
        self._queue.put(request)
        return request

    def drain(self) -> None:
        """Wait for every pending request (their errors stay with them, for their own wait)."""
        with self._lock:
            pending = list(self._pending)
        for request in pending:
            try:
                request.wait()
            except Exception:  # noqa: BLE001, S110 - reported by the request's own wait()
                pass

    def _loop(self) -> None:
        while (request := self._queue.get()) is not None:
            request.execute()

    def close(self) -> None:
        """Finish what is pending, then end the thread."""
        self.drain()
        self._queue.put(None)
        self.thread.join(5)
