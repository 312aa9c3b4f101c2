"""In-process transport: ranks are threads, messages are array copies in each other's mailboxes."""

from __future__ import annotations

from ..base import Communicator, Request
from ..mailbox import Message


class LocalWorld:
    """The mailboxes of `world_size` thread ranks in one process."""

    def __init__(self, world_size: int, timeout: float = 30.0):
        self.comms = [LocalCommunicator(self, rank, world_size, timeout)
                      for rank in range(world_size)]

    def deliver(self, dst: int, msg: Message) -> None:
        """Into rank `dst`'s mailbox."""
        self.comms[dst].deliver(msg)


class LocalCommunicator(Communicator):
    """Same behaviour as the gRPC transport, without processes:
    for instant traces, animations and tests."""

    def __init__(self, world: LocalWorld, rank: int, world_size: int, timeout: float = 30.0):
        super().__init__(rank, world_size, timeout)
        self._world = world

    def _post(self, dst: int, msg: Message, chunk) -> Request:
        request = Request(self, dst, msg.tag, msg.array.nbytes, msg.step, chunk)
        # what crosses a wire is a copy: the sender may reuse its buffer
        msg.array = msg.array.copy()
        self._world.deliver(dst, msg)
        return request
