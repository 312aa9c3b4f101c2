"""The messages of in-flight links (model/links.py): their sender is free once the bytes have left
its port, and a rank's courier thread posts each message when it arrives. Introduced in lessons/16.

Arrivals at one destination never go backwards (that destination's ingress port takes them one
after another), but arrivals at different destinations can: a message to a busy rank may arrive
after a later one to an idle rank. So the courier is a heap by arrival time, ties in the order
they were sent, and a message arriving earlier than the one it sleeps for wakes it.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
import warnings
from collections.abc import Callable

from ..model.links import sleep_until

PRECISE = 1e-3  # seconds before a deadline when the courier stops watching for earlier messages


class Courier:
    """One thread that runs `at(deadline, post)` callables at their deadlines, earliest first."""

    def __init__(self, name: str):
        self._heap: list = []  # (deadline, sequence number, post)
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def at(self, deadline: float, post: Callable[[], None]) -> None:
        """Run `post()` on the courier's thread at time.monotonic() `deadline` (or as soon after
        as the earlier ones allow)."""
        with self._cond:
            if self._closed:
                raise RuntimeError("this rank's courier is closed: its communicator was closed")
            heapq.heappush(self._heap, (deadline, next(self._order), post))
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    if not self._heap:
                        if self._closed:
                            return
                        self._cond.wait()  # idle until a message or close(): nothing to miss
                        continue
                    deadline = self._heap[0][0]
                    left = deadline - time.monotonic() - PRECISE
                    if left <= 0:
                        break
                    self._cond.wait(left)  # an earlier message may come in meanwhile
            sleep_until(deadline)  # the last stretch, precisely
            with self._cond:
                _, _, post = heapq.heappop(self._heap)  # the earliest now: due by then
            post()  # never raises: the request keeps what went wrong

    def close(self, timeout: float = 5.0) -> None:
        """Post what is queued, then stop the thread (waits at most `timeout` seconds)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)
        if self._thread.is_alive():  # a daemon thread: it dies with the process; say so
            warnings.warn(f"{self._thread.name} still had messages to post after {timeout} s",
                          stacklevel=2)
