"""The exceptions a collective raises; each names the ranks involved and what to do next."""

from __future__ import annotations


class CollectiveError(RuntimeError):
    """A collective could not complete; `ranks` lists the ranks the message blames."""

    def __init__(self, message: str, *, ranks: tuple[int, ...] = ()):
        super().__init__(message)
        self.ranks = tuple(ranks)

    def __reduce__(self):  # keep `ranks` when pickled between processes
        return (_rebuild, (type(self), self.args[0], self.ranks))


def _rebuild(cls, message, ranks):
    return cls(message, ranks=ranks)


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
