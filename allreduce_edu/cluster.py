"""Cluster: real rank processes for a notebook, and a function run on all of them. Introduced in lessons/00."""

from __future__ import annotations

import io
import linecache
import multiprocessing
import multiprocessing.connection
import queue
import re
import secrets
import signal
import sys
import threading
import time
import types
import weakref

import cloudpickle

from .comm.errors import CollectiveAborted, CollectiveError, CollectiveMismatch, CollectiveTimeout, RankFailure
from .comm.local import LocalWorld
from .rank import Report, execute
from .trace import Trace

TRANSPORTS = ("grpc", "local")
GRACE = 3.0  # seconds ranks get to stop after an abort before they are killed (and replaced)

GUARD_HINT = ("Rank processes are started with 'spawn', which re-imports your script in every rank. "
              "Put the code that creates the Cluster under\n\n    if __name__ == \"__main__\":\n\n"
              "so the ranks do not start clusters of their own.")


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
            self._world = _Processes(self.world_size, secrets.token_hex(16), self.host, self.timeout, self.tls,
                                     self.links)
        else:
            self._world = _Threads(self.world_size, self.timeout, self.links)
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
        self._world.submit(self._run_id, fn, args, kwargs)
        reports: dict[int, Report] = {}
        try:
            self._collect(reports)
        except KeyboardInterrupt:
            self._stop(reports, CollectiveAborted("the caller interrupted cluster.run (KeyboardInterrupt)"))
            raise
        finally:
            self._world.finish()
            self.trace = Trace.merge([Trace(r.events, r.receives, r.dropped) for r in reports.values()])
            _print_outputs(reports)
        failures = [r for r in reports.values() if r.kind != "result"]
        if failures:
            raise _root_cause(failures, fn)
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


def ship(fn, args, kwargs) -> bytes:
    """Pickle a call for the ranks. Functions from notebooks, scripts, tests and modules beside them go
    by value (a rank may not be able to import them); installed packages go by reference."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    by_value = module is not None and module.__name__ not in ("__main__", "builtins") and _is_local(module)
    if by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps((fn, args, kwargs))
    finally:
        if by_value:
            cloudpickle.unregister_pickle_by_value(module)


def _is_local(module) -> bool:
    path = getattr(module, "__file__", None) or ""
    return bool(path) and "-packages" not in path and not module.__name__.startswith("allreduce_edu")


class _Processes:
    """One spawned process per rank, each a gRPC server; the parent talks to each over a pipe."""

    def __init__(self, world_size: int, token: str, host: str, timeout: float, tls=None, links=None):
        from . import rank as rank_module

        ctx = multiprocessing.get_context("spawn")  # never fork: gRPC and Numba's threads are not fork-safe
        self.conns, self.procs = [], []
        for rank in range(world_size):
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(target=rank_module.main, name=f"allreduce-edu-rank-{rank}", daemon=True,
                               args=(rank, world_size, token, host, timeout, child_end, tls, links))
            proc.start()
            child_end.close()
            self.conns.append(parent_end)
            self.procs.append(proc)
        try:
            self.addresses = self._gather("ready", max(60.0, timeout))
            for conn in self.conns:
                conn.send(("peers", self.addresses))
            self._gather("connected", max(60.0, timeout))
        except BaseException:
            self.close()
            raise

    def _gather(self, expected: str, timeout: float) -> list:
        """Wait until every rank has sent (`expected`, value); explain a rank that died instead."""
        values, deadline = {}, time.monotonic() + timeout
        while len(values) < len(self.procs):
            waiting = [c for r, c in enumerate(self.conns) if r not in values]
            ready = multiprocessing.connection.wait(
                waiting + [p.sentinel for r, p in enumerate(self.procs) if r not in values],
                max(deadline - time.monotonic(), 0))
            if not ready:
                raise RankFailure(f"ranks {sorted(set(range(len(self.procs))) - set(values))} did not start "
                                  f"within {timeout:.0f} s")
            for rank, conn in enumerate(self.conns):
                if conn in ready and rank not in values:
                    try:
                        kind, value = conn.recv()
                    except EOFError:
                        continue  # it died: its sentinel says so below
                    if kind != expected:
                        raise RankFailure(f"rank {rank} failed to start: {value}", ranks=(rank,))
                    values[rank] = value
            for rank, proc in enumerate(self.procs):
                if rank not in values and not proc.is_alive():
                    raise RuntimeError(f"rank {rank} exited while starting (exit code {proc.exitcode}). "
                                       + (GUARD_HINT if hasattr(sys.modules["__main__"], "__file__") else ""))
        return [values[r] for r in range(len(self.procs))]

    def submit(self, run_id: int, fn, args, kwargs) -> None:
        payload = ship(fn, args, kwargs)
        for conn in self.conns:
            conn.send(("run", (run_id, run_id, payload)))

    def wait(self, timeout: float, run_id: int) -> list[Report]:
        """Reports that arrived within `timeout`, plus a "died" report for each rank that exited."""
        reports = []
        live = [r for r, p in enumerate(self.procs) if not isinstance(p, _Closed)]
        ready = multiprocessing.connection.wait([self.conns[r] for r in live] + [self.procs[r].sentinel for r in live],
                                                timeout)
        for rank in live:
            conn = self.conns[rank]
            if conn in ready:
                try:
                    kind, report = conn.recv()
                except (EOFError, OSError):
                    continue
                if report.run_id == run_id:
                    reports.append(report)
        for rank in live:
            proc = self.procs[rank]
            if proc.sentinel in ready and not proc.is_alive() and not any(r.rank == rank for r in reports):
                code = proc.exitcode
                how = f"killed by {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
                reports.append(Report(rank, run_id, kind="died", error=RankFailure(
                    f"rank {rank} died ({how})", ranks=(rank,))))
                self.conns[rank], self.procs[rank] = _Closed(), _Closed()
        return reports

    def finish(self) -> None:
        pass

    def abort(self, error: CollectiveError) -> None:
        for conn in self.conns:
            try:
                conn.send(("abort", error))
            except (OSError, AttributeError):
                pass

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(("close", None))
            except (OSError, AttributeError):
                pass
        deadline = time.monotonic() + 5.0
        for proc in self.procs:
            proc.join(max(deadline - time.monotonic(), 0.1))
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
        for conn in self.conns:
            conn.close()


class _Closed:
    """Stands in for the pipe and process of a rank that died."""

    sentinel = None

    def __getattr__(self, name):
        raise AttributeError(name)

    def is_alive(self) -> bool:
        return False

    def join(self, timeout=None) -> None:
        pass

    def close(self) -> None:
        pass


class _Threads:
    """One thread per rank in this process, over the local transport."""

    def __init__(self, world_size: int, timeout: float, links=None):
        self.world = LocalWorld(world_size, timeout)
        for comm in self.world.comms:
            comm.links = links
        self.addresses = [f"local:{rank}" for rank in range(world_size)]
        self._reports: queue.SimpleQueue = queue.SimpleQueue()
        self._router: _OutputRouter | None = None

    def submit(self, run_id: int, fn, args, kwargs) -> None:
        payload = ship(fn, args, kwargs)  # the same by-value semantics as processes
        self._router = _OutputRouter.install()
        for comm in self.world.comms:
            comm.begin_run(run_id)  # before any thread starts: an abort that follows must not be undone
        for comm in self.world.comms:
            threading.Thread(target=self._run, args=(comm, run_id, payload), name=f"local-rank{comm.rank}",
                             daemon=True).start()

    def _run(self, comm, run_id, payload) -> None:
        output = io.StringIO()
        self._router.buffers[threading.get_ident()] = output
        try:
            self._reports.put(execute(comm, run_id, payload, output))
        finally:
            self._router.buffers.pop(threading.get_ident(), None)

    def finish(self) -> None:
        if self._router is not None:
            self._router.uninstall()

    def wait(self, timeout: float, run_id: int) -> list[Report]:
        reports = []
        try:
            reports.append(self._reports.get(timeout=timeout))
            while True:
                reports.append(self._reports.get_nowait())
        except queue.Empty:
            pass
        return [r for r in reports if r.run_id == run_id]

    def abort(self, error: CollectiveError) -> None:
        for comm in self.world.comms:
            comm.abort(error)

    def close(self) -> None:
        self.abort(CollectiveAborted("the cluster was closed"))


class _OutputRouter(io.TextIOBase):
    """sys.stdout for thread ranks: each rank thread writes to its own buffer, others pass through."""

    def __init__(self, fallback):
        self.fallback, self.buffers = fallback, {}

    @classmethod
    def install(cls) -> _OutputRouter:
        if not isinstance(sys.stdout, cls):
            sys.stdout = cls(sys.stdout)
        return sys.stdout

    def uninstall(self) -> None:
        if sys.stdout is self:
            sys.stdout = self.fallback

    def write(self, text: str) -> int:
        return self.buffers.get(threading.get_ident(), self.fallback).write(text)

    def flush(self) -> None:
        self.fallback.flush()


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


def _root_cause(failures: list[Report], fn) -> BaseException:
    """The exception `run` raises: the root cause, with its rank, remote traceback and the other ranks' fate."""
    cause = min(failures, key=_severity)  # min() keeps arrival order among equals
    error = cause.error
    if cause.traceback and error.__traceback__ is None:  # it came from another process
        error.__cause__ = RemoteTraceback(_restore_sources(cause.traceback, fn))
    name = getattr(fn, "__name__", repr(fn))
    notes = [f"raised on rank {cause.rank} in cluster.run({name})"]
    others = [r for r in failures if r is not cause]
    stopped = sorted(r.rank for r in others if type(r.error) is CollectiveAborted)
    if stopped:
        notes.append(f"rank(s) {', '.join(map(str, stopped))} stopped their collective because of it")
    notes += [f"rank {r.rank} also raised {type(r.error).__name__}: {str(r.error)[:300]}"
              for r in others if type(r.error) is not CollectiveAborted]
    if cause.kind == "died":
        notes.append("call cluster.restart() for a full world")
    _add_note(error, "\n".join(notes))
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


def _print_outputs(reports: dict[int, Report]) -> None:
    """Print what each rank printed, prefixed by its rank, one rank after another."""
    for rank in sorted(reports):
        for line in reports[rank].output.splitlines():
            print(f"[rank {rank}] {line}")
