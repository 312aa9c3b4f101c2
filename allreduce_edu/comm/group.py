"""A sub-communicator: some ranks of a communicator seen as a world of their own.
Lessons 05 and 09.

MPI calls it `Comm_split`, torch.distributed `new_group`, NCCL `ncclCommSplit`: ranks renumbered
0..len(ranks)-1, and every message tag prefixed with the group's name, so two groups that share
ranks never take each other's messages. Inside a collective of the whole world (the hierarchical
all-reduce's phases), a group's collective is part of the world's call; on its own, it is a call of
the group's, numbered in the group's own space (comm.calls), so the ranks outside the group stay in
step. Its non-blocking collectives run on the rank's one communication thread, in issue order.
"""

from __future__ import annotations

import zlib

from .contract import Comm


class Group(Comm):
    """`ranks` of `comm` (this rank among them) as a communicator of `len(ranks)` ranks,
    named `name`."""

    def __init__(self, comm, ranks, name: str):
        ranks = [int(r) for r in ranks]
        if comm.rank not in ranks or len(set(ranks)) != len(ranks):
            raise ValueError(f"rank {comm.rank}: a group needs distinct ranks including this one, "
                             f"got {ranks}")
        self.parent, self.ranks, self.name = comm, ranks, name
        self.rank, self.world_size = ranks.index(comm.rank), len(ranks)
        self.ranks_per_node: int | None = None  # a group is flat unless told otherwise
        self.links = comm.links  # its messages cross the parent's links
        # its calls' numbering: the same on every member (from the name and the members), never
        # the world's 0, and small enough for every transport's 64-bit header
        self.space = 1 + zlib.crc32(f"{name}:{ranks}".encode()) % ((1 << 31) - 1)

    def __repr__(self) -> str:
        return f"Group({self.name!r}, ranks={self.ranks}, rank={self.rank})"

    def isend(self, dst, array, tag, **kw):
        return self.parent.isend(self.ranks[dst], array, f"{self.name}/{tag}", **kw)

    def send(self, dst, array, tag, **kw) -> None:
        self.parent.send(self.ranks[dst], array, f"{self.name}/{tag}", **kw)

    def send_buffer(self, dst, shape, dtype):
        return self.parent.send_buffer(self.ranks[dst], shape, dtype)

    def recv(self, src, tag, timeout=None):
        return self.parent.recv(self.ranks[src], f"{self.name}/{tag}", timeout)

    def sendrecv(self, dst, array, src, tag, **kw):
        """The parent's sendrecv, in this group's numbering and tags."""
        return self.parent.sendrecv(self.ranks[dst], array, self.ranks[src], f"{self.name}/{tag}",
                                    **kw)

    def collective(self, name: str, **kwargs):
        """Inside a collective of the whole world, part of it; on its own, a call of the group's,
        numbered in its own space (the ranks outside never count it)."""
        kwargs.setdefault("space", self.space)  # a group of a group numbers in its own space
        return self.parent.collective(name, **kwargs)

    def progress(self):
        """The rank's one communication thread: the group's requests queue with the world's."""
        return self.parent.progress()
