"""The exceptions a collective raises; each names the ranks involved and what to do next."""

from __future__ import annotations


class CollectiveError(RuntimeError):
    """A collective could not complete; `ranks` lists the ranks the message blames;
    `waiting_for`, the rank this one was waiting for when it was raised (None: none)."""

    def __init__(self, message: str, *, ranks: tuple[int, ...] = (),
                 waiting_for: int | None = None):
        super().__init__(message)
        self.ranks = tuple(ranks)
        self.waiting_for = waiting_for

    def __reduce__(self):  # keep ranks, waiting_for and any notes when pickled between processes
        return (_rebuild, (type(self), self.args[0], self.ranks, self.waiting_for), self.__dict__)


def _rebuild(cls, message, ranks, waiting_for=None):
    return cls(message, ranks=ranks, waiting_for=waiting_for)


class RankFailure(CollectiveError):
    """A peer rank died or became unreachable."""


class CollectiveTimeout(CollectiveError):
    """A deadline passed while waiting for a peer (`Cluster(timeout=...)`, 30 s by default)."""


class CollectiveMismatch(CollectiveError):
    """Ranks called different collectives,
    or the same one with different shape, dtype, op or algorithm."""


class CollectiveAborted(CollectiveError):
    """Another rank failed, so this rank's collective was stopped early
    (the root cause is raised elsewhere)."""
