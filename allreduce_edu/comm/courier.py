"""The messages of in-flight links (comm.links): their sender is free once the bytes have left its
port, and a rank's courier thread posts each message when it arrives, in the order they were
sent. Introduced in lessons/16.

A link's arrival times from one rank never go backwards (its one port sends one message after
another), so the courier is a queue, not a heap.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

from .links import sleep_until


class Courier:
    """One thread that runs `at(deadline, post)` callables at their deadlines, in order."""

    def __init__(self, name: str):
        self._queue: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def at(self, deadline: float, post: Callable[[], None]) -> None:
        """Run `post()` on the courier's thread at time.monotonic() `deadline` (or after the
        earlier ones, if they run late)."""
        with self._cond:
            if self._closed:
                raise RuntimeError("this rank's courier is closed: its communicator was closed")
            self._queue.append((deadline, post))
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                deadline, post = self._queue[0]
            sleep_until(deadline)
            with self._cond:
                self._queue.popleft()
            post()  # never raises: the request keeps what went wrong

    def close(self, timeout: float = 5.0) -> None:
        """Post what is queued, then stop the thread (waits at most `timeout` seconds)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)
