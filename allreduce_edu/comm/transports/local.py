"""In-process transport: ranks are threads, messages are array copies in each other's mailboxes."""

from __future__ import annotations

import threading
import time

import numpy as np

from ..base import Communicator, Request
from ..errors import CollectiveMismatch, CollectiveTimeout
from ..mailbox import Message


class LocalWorld:
    """The mailboxes of `world_size` thread ranks in one process."""

    def __init__(self, world_size: int, timeout: float = 30.0):
        self.comms = [LocalCommunicator(self, rank, world_size, timeout)
                      for rank in range(world_size)]
        self.windows: dict[int, dict[int, np.ndarray]] = {}  # window number -> rank -> its memory
        self._joined = threading.Condition()

    def join_window(self, number: int, rank: int, memory: np.ndarray, deadline: float) -> list:
        """Every rank's memory of window `number`, once all have joined (comm.window)."""
        with self._joined:
            ranks = self.windows.setdefault(number, {})
            ranks[rank] = memory
            self._joined.notify_all()
            while len(ranks) < len(self.comms):
                if not self._joined.wait(max(0.0, deadline - time.monotonic())):
                    missing = sorted(set(range(len(self.comms))) - set(ranks))
                    raise CollectiveTimeout(f"rank {rank}: ranks {missing} did not open symmetric "
                                            f"window {number} in time", ranks=tuple(missing))
            sizes = {r: m.size for r, m in ranks.items() if m.size != memory.size}
            if sizes:
                other = min(sizes)
                raise CollectiveMismatch(f"rank {other} opened window {number} with "
                                         f"{sizes[other]} bytes, rank {rank} with {memory.size}",
                                         ranks=(other, rank))
            return [ranks[r] for r in range(len(self.comms))]

    def deliver(self, dst: int, msg: Message) -> None:
        """Into rank `dst`'s mailbox."""
        self.comms[dst].deliver(msg)


class LocalCommunicator(Communicator):
    """Same behaviour as the gRPC transport, without processes:
    for instant traces, animations and tests."""

    def __init__(self, world: LocalWorld, rank: int, world_size: int, timeout: float = 30.0):
        super().__init__(rank, world_size, timeout)
        self._world = world
        self._windows = 0

    def open_window(self, nbytes: int) -> list:
        """A window of `nbytes` on this rank, and every rank's (comm.window.rendezvous): threads
        share one process, so a window is plain memory every rank can reach."""
        self._windows += 1
        memory = self._world.join_window(self._windows, self.rank, np.zeros(nbytes, np.uint8),
                                         time.monotonic() + self.timeout)
        return self._windows, memory, lambda: None

    def close_window(self, number: int) -> None:
        self._world.windows.pop(number, None)

    def _post(self, dst: int, msg: Message, chunk) -> Request:
        request = Request(self, dst, msg.tag, msg.array.nbytes, msg.step, chunk)
        # what crosses a wire is a copy: the sender may reuse its buffer
        msg.array = msg.array.copy()
        self._world.deliver(dst, msg)
        return request
