"""Cluster: real rank processes for a notebook, and a function run on all of them. Introduced in lessons/00."""

from __future__ import annotations

import linecache
import multiprocessing
import re
import secrets
import time
import types
import weakref

from ..comm.errors import CollectiveAborted, CollectiveError, CollectiveMismatch, CollectiveTimeout, RankFailure
from ..trace import Trace
from .processes import GUARD_HINT, ProcessRanks
from .threads import ThreadRanks
from .worker import GRACE, Report

TRANSPORTS = ("grpc", "local")


class RemoteTraceback(Exception):
    """The traceback of an exception raised on a rank process (shown as the cause)."""

    def __str__(self) -> str:
        return "\n" + self.args[0]


class Cluster:
    """`world_size` ranks that stay up between `run` calls; `run(fn)` calls fn(comm) on every rank.

    transport="grpc": one process per rank, each a gRPC server on `host` (127.0.0.1: this machine only),
    with TLS when `tls` (a `TLS` of PEM bytes) is given. transport="local": one thread per rank in this
    process, for instant traces and tests. `timeout` bounds every wait for a peer, in seconds.
    `links` (see allreduce_edu.comm.links) delays every message as an emulated network link would.
    """

    def __init__(self, world_size: int = 4, transport: str = "grpc", timeout: float = 30.0,
                 host: str = "127.0.0.1", tls=None, links=None):
        if getattr(multiprocessing.current_process(), "_inheriting", False):
            raise RuntimeError("A Cluster was created while a rank process was starting. " + GUARD_HINT)
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
        if transport not in TRANSPORTS:
            raise ValueError(f"unknown transport {transport!r}; valid: {', '.join(TRANSPORTS)}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.world_size, self.transport, self.timeout, self.host = world_size, transport, timeout, host
        self.tls, self.links = tls, links
        self.trace = Trace()
        self._run_id = 0
        self._world = None
        self._start()

    def _start(self) -> None:
        self._dead: set[int] = set()
        if self.transport == "grpc":
            self._world = ProcessRanks(self.world_size, secrets.token_hex(16), self.host, self.timeout, self.tls,
                                     self.links)
        else:
            self._world = ThreadRanks(self.world_size, self.timeout, self.links)
        self._finalizer = weakref.finalize(self, self._world.close)

    @property
    def addresses(self) -> list[str]:
        """Where each rank listens, by rank ("127.0.0.1:PORT"; "local:R" for the local transport)."""
        return list(self._world.addresses)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._dead)} dead" if self._dead else "up"
        return f"Cluster(world_size={self.world_size}, transport={self.transport!r}, {state})"

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """End every rank process; idempotent."""
        self._finalizer()

    def restart(self) -> None:
        """Replace every rank with a fresh one: a full world again after a failure."""
        self.close()
        self._start()

    def run(self, fn, *args, **kwargs) -> list:
        """Call `fn(comm, *args, **kwargs)` on every rank; return the results by rank.

        An exception on any rank stops the others at once and is raised here, naming its rank.
        """
        if self.closed:
            raise RuntimeError("this Cluster is closed; create a new one (or call restart())")
        if self._dead:
            raise RankFailure(f"rank(s) {sorted(self._dead)} died in an earlier run; call cluster.restart() "
                              f"for a full world of {self.world_size}", ranks=tuple(sorted(self._dead)))
        self._run_id += 1
        try:
            self._world.submit(self._run_id, fn, args, kwargs)
        except RankFailure as e:
            self._dead.update(e.ranks)
            raise
        reports: dict[int, Report] = {}
        try:
            self._collect(reports)
        except KeyboardInterrupt:
            self._stop(reports, CollectiveAborted("the caller interrupted cluster.run (KeyboardInterrupt)"))
            raise
        finally:
            self._world.finish()
            self.trace = Trace.merge([Trace(r.events, r.receives, r.dropped) for r in reports.values()])
            print_outputs(reports)
        failures = [r for r in reports.values() if r.kind != "result"]
        if failures:
            raise root_cause(failures, fn)
        return [reports[rank].value for rank in range(self.world_size)]

    def _collect(self, reports: dict[int, Report]) -> None:
        """Wait for every rank's report; on the first failure, abort the rest."""
        while len(reports) < self.world_size:
            failures = [r for r in self._receive(reports) if r.kind != "result"]
            if failures:
                return self._stop(reports, _abort_error(failures[0]))

    def _receive(self, reports: dict[int, Report]) -> list[Report]:
        """Add the reports that arrive within a short wait to `reports`; return them."""
        new = [r for r in self._world.wait(0.05, self._run_id) if r.rank not in reports]
        for report in new:
            reports[report.rank] = report
            if report.kind == "died":
                self._dead.add(report.rank)
        return new

    def _stop(self, reports: dict[int, Report], error: CollectiveError) -> None:
        """Abort the collective on every rank still running; kill (and replace) any that does not stop."""
        self._world.abort(error)
        deadline = time.monotonic() + GRACE
        while len(reports) < self.world_size and time.monotonic() < deadline:
            self._receive(reports)
        stuck = [rank for rank in range(self.world_size) if rank not in reports]
        for rank in stuck:
            reports[rank] = Report(rank, self._run_id, kind="stuck", error=CollectiveTimeout(
                f"rank {rank} was busy outside any collective while the others gave up on it ({error}); "
                f"it did not stop within {GRACE:.0f} s, so the Cluster replaced all ranks", ranks=(rank,)))
        if stuck:
            self.restart()


def _abort_error(report: Report) -> CollectiveError:
    """What the other ranks are told when `report`'s rank failed."""
    if report.kind == "died":
        return report.error  # RankFailure naming the dead rank: the survivors raise exactly this
    return CollectiveAborted(f"rank {report.rank} failed ({type(report.error).__name__}: {report.error}); "
                             f"this rank stopped its collective", ranks=(report.rank,))


def _severity(report: Report) -> int:
    """Lower is closer to the root cause: a death; the user's error or a mismatch; a rank stuck outside
    any collective (the others' timeouts point at it, or at ranks that waited on it); then the effects."""
    e = report.error
    if report.kind == "died":
        return 0
    if isinstance(e, CollectiveMismatch) or not isinstance(e, CollectiveError):
        return 1
    if report.kind == "stuck":
        return 2
    return 3 if isinstance(e, (CollectiveTimeout, RankFailure)) else 4


def root_cause(failures: list[Report], fn, where: str | None = None) -> BaseException:
    """The exception to raise for failed ranks: the root cause, with its rank, remote traceback and the
    other ranks' fate. `where` names the call (default "cluster.run(fn)")."""
    cause = min(failures, key=_severity)  # min() keeps arrival order among equals
    error = cause.error
    if cause.traceback and error.__traceback__ is None:  # it came from another process
        error.__cause__ = RemoteTraceback(_restore_sources(cause.traceback, fn))
    where = where or f"cluster.run({getattr(fn, '__name__', repr(fn))})"
    notes = [f"raised on rank {cause.rank} in {where}"]
    others = [r for r in failures if r is not cause]
    stopped = sorted(r.rank for r in others if type(r.error) is CollectiveAborted)
    if stopped:
        notes.append(f"rank(s) {', '.join(map(str, stopped))} stopped their collective because of it")
    notes += [f"rank {r.rank} also raised {type(r.error).__name__}: {str(r.error)[:300]}"
              for r in others if type(r.error) is not CollectiveAborted]
    if cause.kind == "died":
        notes.append("call cluster.restart() for a full world")
    for note in notes:
        _add_note(error, note)
    return error


def _restore_sources(text: str, fn) -> str:
    """Put file names and source lines back into a rank's traceback: code shipped by value lost them."""
    codes: dict[str, list] = {}
    todo = [getattr(fn, "__code__", None)] + [getattr(f, "__code__", None) for f in getattr(fn, "__globals__", {}).values()]
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
                return f'File "{code.co_filename}", line {line}, in {name}' + (f"\n    {source}" if source else "")
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
