"""What a failed run tells its caller: the root cause, raised with its rank and traceback,
and one line for everything that followed from it. Used by the Cluster and by run_on_engine."""

from __future__ import annotations

import linecache
import re
import types
from collections import defaultdict

from ..comm.errors import (
    CollectiveAborted,
    CollectiveError,
    CollectiveMismatch,
    CollectiveTimeout,
    RankFailure,
)
from .worker import Report


class RemoteTraceback(Exception):
    """The traceback of an exception raised on a rank process (shown as the cause)."""

    def __str__(self) -> str:
        return "\n" + self.args[0]


def abort_error(report: Report) -> CollectiveError:
    """What the other ranks are told when `report`'s rank failed."""
    if report.kind == "died":
        return report.error  # RankFailure naming the dead rank: the survivors raise exactly this
    return CollectiveAborted(f"rank {report.rank} failed "
                             f"({type(report.error).__name__}: {report.error}); "
                             f"this rank stopped its collective", ranks=(report.rank,))


def _severity(report: Report) -> int:
    """Lower is closer to the root cause: a death; the user's error or a mismatch; a rank stuck
    outside any collective (the others' timeouts point at it, or at ranks that waited on it);
    then the effects."""
    e = report.error
    if report.kind == "died":
        return 0
    if isinstance(e, CollectiveMismatch) or not isinstance(e, CollectiveError):
        return 1
    if report.kind == "stuck":
        return 2
    return 3 if isinstance(e, (CollectiveTimeout, RankFailure)) else 4


def absent(failures: list[Report], finished) -> tuple[int, list[int]] | None:
    """(the rank that never took part, the ranks that waited for it) when the ranks' waits lead,
    one to the next, to a rank that returned (`finished`) while the others waited in a collective;
    None when they lead nowhere (a cycle) or to no such rank. Every wait's error names the rank it
    was for (CollectiveError.waiting_for), whichever rank timed out first."""
    waits = {r.rank: r.error.waiting_for for r in failures
             if isinstance(r.error, CollectiveError) and r.error.waiting_for is not None}
    ends: dict[int, list[int]] = defaultdict(list)
    for start in waits:
        rank, seen = start, {start}
        while rank in waits and waits[rank] not in seen:
            rank = waits[rank]
            seen.add(rank)
        if rank not in waits and rank in finished:
            ends[rank].append(start)
    if len(ends) != 1:
        return None
    (rank, waiters), = ends.items()
    return rank, sorted(waiters)


def _did_not_take_part(rank: int, waiters: list[int], cause: Report, where: str) -> Report:
    """The report to raise when `rank` returned while `waiters` waited for it."""
    what = cause.error.call  # the collective the waiter was in (a CollectiveError: severity >= 3)
    return Report(rank, cause.run_id, kind="error", error=CollectiveTimeout(
        f"rank {rank} returned from {where} while rank(s) {_list(waiters)} waited for it"
        + (f" in {what}" if what else "") + ": every rank must call the same collectives in the "
        f"same order, and rank {rank} never called this one", ranks=(rank,)))


def root_cause(failures: list[Report], fn, where: str | None = None,
               finished=()) -> BaseException:
    """The exception to raise for failed ranks: the root cause, with its rank, remote traceback
    and the other ranks' fate. `where` names the call (default "cluster.run(fn)"); `finished`,
    the ranks that returned meanwhile (one the others waited for did not take part)."""
    where = where or f"cluster.run({getattr(fn, '__name__', repr(fn))})"
    cause = min(failures, key=_severity)  # min() keeps arrival order among equals
    missing = absent(failures, finished) if _severity(cause) >= 3 else None
    if missing is not None:
        cause = _did_not_take_part(*missing, cause, where)
    error = cause.error
    if cause.traceback and error.__traceback__ is None:  # it came from another process
        error.__cause__ = RemoteTraceback(_restore_sources(cause.traceback, fn))
    try:  # callers (the exercise checkers) read the rank here, never from the text
        error.failed_rank = cause.rank
    except AttributeError:  # an exception type with __slots__: the note below still says it
        pass
    notes = [f"raised on rank {cause.rank} in {where}"]
    others = [r for r in failures if r is not cause]
    stopped = sorted(r.rank for r in others if type(r.error) is CollectiveAborted)
    if stopped:
        notes.append(f"rank(s) {_list(stopped)} stopped their collective because of it")
    # one disagreement, seen from every side: name all its ranks
    if isinstance(error, CollectiveMismatch):
        involved = sorted({rank for r in failures if isinstance(r.error, CollectiveMismatch)
                           for rank in (r.rank, *r.error.ranks)})
        notes.append(f"ranks {_list(involved)} are involved: every rank must make the same call")
        others = [r for r in others if not isinstance(r.error, CollectiveMismatch)]
    also = defaultdict(list)  # one line per kind of follow-on error, not one per rank
    for r in others:
        if type(r.error) is not CollectiveAborted:
            also[type(r.error).__name__].append(r)
    for name, reports in also.items():
        first = str(reports[0].error).split("\n")[0][:200]
        notes.append(f"rank(s) {_list(sorted(r.rank for r in reports))} also raised {name}"
                     + (f": {first}" if len(reports) == 1 else f" (first: {first})"))
    if cause.kind == "died":
        notes.append("call cluster.restart() for a full world")
    for note in notes:
        _add_note(error, note)
    return error


def _restore_sources(text: str, fn) -> str:
    """Put file names and source lines back into a rank's traceback:
    code shipped by value lost them."""
    codes: dict[str, list] = {}
    todo = [getattr(fn, "__code__", None)] + [getattr(f, "__code__", None)
                                              for f in getattr(fn, "__globals__", {}).values()]
    while todo:
        code = todo.pop()
        if isinstance(code, types.CodeType):
            codes.setdefault(code.co_name, []).append(code)
            todo.extend(c for c in code.co_consts if isinstance(c, types.CodeType))

    def restore(match: re.Match) -> str:
        line, name = int(match[1]), match[2]
        for code in codes.get(name, []):
            lines = [n for _, _, n in code.co_lines() if n is not None]
            if lines and min(lines) <= line <= max(lines):
                source = linecache.getline(code.co_filename, line).strip()
                return (f'File "{code.co_filename}", line {line}, in {name}'
                        + (f"\n    {source}" if source else ""))
        return match[0]

    return re.sub(r'File "<dynamic-code>", line (\d+), in (\S+)', restore, text)


def _add_note(error: BaseException, note: str) -> None:
    if hasattr(error, "add_note"):
        error.add_note(note)


def print_outputs(reports: dict[int, Report]) -> None:
    """Print what each rank printed, prefixed by its rank, one rank after another."""
    for rank in sorted(reports):
        for line in reports[rank].output.splitlines():
            print(f"[rank {rank}] {line}")


def _list(ranks) -> str:
    return ", ".join(map(str, ranks))
