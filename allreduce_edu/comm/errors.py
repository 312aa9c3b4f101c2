"""The exceptions a collective raises; each names the ranks involved and what to do next."""

from __future__ import annotations


class CollectiveError(RuntimeError):
    """A collective could not complete; `ranks` lists the ranks the message blames;
    `waiting_for`, the rank this one was waiting for when it was raised (None: none); `call`, the
    collective call it waited in, as its signature reads ("" outside one, or not known)."""

    def __init__(self, message: str, *, ranks: tuple[int, ...] = (),
                 waiting_for: int | None = None, call: str = ""):
        super().__init__(message)
        self.ranks = tuple(ranks)
        self.waiting_for, self.call = waiting_for, call

    def __reduce__(self):  # keep every field and any notes when pickled between processes
        return (_rebuild, (type(self), self.args[0], self.ranks, self.waiting_for, self.call),
                self.__dict__)


def _rebuild(cls, message, ranks, waiting_for=None, call=""):
    return cls(message, ranks=ranks, waiting_for=waiting_for, call=call)


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
