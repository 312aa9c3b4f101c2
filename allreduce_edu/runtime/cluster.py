"""Cluster: real rank processes for a notebook, and a function run on all of them.
Introduced in lessons/00."""

from __future__ import annotations

import multiprocessing
import threading
import time
import warnings
import weakref

from ..comm.errors import CollectiveAborted, CollectiveError, CollectiveTimeout, RankFailure
from ..trace import Trace
from .failures import abort_error, print_outputs, root_cause
from .limits import check_world_size
from .processes import GUARD_HINT
from .rules import check, in_the_clear
from .transports import TRANSPORTS
from .transports import transport as transport_row
from .worker import GRACE, Report

__all__ = ["Cluster", "TRANSPORTS"]


class Cluster:
    """`world_size` ranks that stay up between `run` calls; `run(fn)` calls fn(comm) on every rank.

    transport="grpc": one process per rank, each a gRPC server on `host`
    (127.0.0.1: this machine only), with TLS when `tls` (a `TLS` of PEM bytes) is given.
    transport="shm": the same processes, gRPC for control; their messages' bytes go through
    shared memory (allreduce_edu.comm.transports.shm).
    transport="local": one thread per rank in this process, for instant traces and tests.
    `timeout` bounds every wait for a peer, in seconds.
    `links` (see allreduce_edu.model.links) delays every message as an emulated network link would.
    A world larger than this machine holds is refused before anything starts
    (`max_ranks` overrides).
    """

    def __init__(self, world_size: int = 4, transport: str = "grpc", timeout: float = 30.0,
                 host: str = "127.0.0.1", tls=None, links=None, max_ranks: int | None = None):
        if getattr(multiprocessing.current_process(), "_inheriting", False):
            raise RuntimeError("A Cluster was created while a rank process was starting. "
                               + GUARD_HINT)
        row = transport_row(transport)
        check_world_size(world_size, row.processes, max_ranks)
        # every value checked before a rank starts (runtime/rules.py)
        timeout, host, links = (check("timeout", timeout), check("host", host),
                                check("links", links))
        exposed = in_the_clear(host, tls) if row.processes else ""
        if exposed:
            warnings.warn(exposed, stacklevel=2)
        self.world_size, self.transport, self._row = world_size, transport, row
        self.timeout, self.host = timeout, host
        self.tls, self.links = tls, links
        self.trace = Trace()
        self._run_id = 0
        self._turn = threading.Lock()  # held by the thread whose run is on the ranks
        self._world = None
        self._start()

    def _start(self) -> None:
        self._dead: set[int] = set()
        # emulated links: one table of every rank's port, shared by this world's ranks
        links = self.links.attach(self.world_size) if self.links is not None else None
        self._world = self._row.ranks(self._row, self.world_size, self.timeout, self.host,
                                      self.tls, links)
        self._finalizer = weakref.finalize(self, self._world.close)

    @property
    def addresses(self) -> list[str]:
        """Where each rank listens, by rank
        ("127.0.0.1:PORT"; "local:R" for the local transport)."""
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
        """Replace every rank with a fresh one: a full world again after a failure. Interrupted
        meanwhile, the Cluster stays closed and says so (`restart()` again makes a new world)."""
        self.close()
        try:
            self._start()
        except KeyboardInterrupt:
            raise KeyboardInterrupt(
                f"interrupted while replacing the ranks: this Cluster of {self.world_size} is "
                f"closed now; call cluster.restart() for a new world") from None

    def run(self, fn, *args, **kwargs) -> list:
        """Call `fn(comm, *args, **kwargs)` on every rank; return the results by rank.

        An exception on any rank stops the others at once and is raised here, naming its rank.
        Interrupted (Ctrl-C, "interrupt kernel"), it stops every rank, replaces those that do not
        stop, and says so. Calls from several threads (a widget's callback beside a cell) take
        turns: each runs alone on the ranks and gets its own results.
        """
        __tracebackhide__ = True  # IPython's debugger skips these frames
        with self._turn:  # the ranks run one call at a time, and a report names its run
            return self._run(fn, args, kwargs)

    def _run(self, fn, args, kwargs) -> list:
        __tracebackhide__ = True
        if self.closed:
            raise RuntimeError("this Cluster is closed; create a new one (or call restart())")
        if self._dead:
            raise RankFailure(f"rank(s) {sorted(self._dead)} died in an earlier run; "
                              f"call cluster.restart() for a full world of {self.world_size}",
                              ranks=tuple(sorted(self._dead)))
        self._run_id += 1
        reports: dict[int, Report] = {}
        self._returned_first: list[int] = []  # ranks that returned before the first failure
        interrupted, handed = None, False
        try:
            try:  # interrupted half-way, some ranks run it: they are stopped as in any run
                self._world.submit(self._run_id, fn, args, kwargs)
                handed = True
            except RankFailure as e:
                self._dead.update(e.ranks)
                raise
            self._collect(reports)
        except KeyboardInterrupt:
            if self.closed:  # interrupted while the ranks were replaced: restart() said so
                raise
            running = [r for r in range(self.world_size) if r not in reports]
            replaced = self._stop(reports, CollectiveAborted("the caller interrupted cluster.run"))
            interrupted = _interrupted(fn, running, replaced, self.world_size, self.transport,
                                       handed)
        finally:
            self._world.finish()
            if handed:  # a call no rank ran leaves the last run's trace
                self.trace = Trace.merge([Trace(r.events, r.receives, r.dropped)
                                          for r in reports.values()])
            print_outputs(reports)
        if interrupted:
            # the multiprocessing frames say nothing useful
            raise KeyboardInterrupt(interrupted) from None
        failures = [r for r in reports.values() if r.kind != "result"]
        if failures:
            raise root_cause(failures, fn, finished=self._returned_first)
        return [reports[rank].value for rank in range(self.world_size)]

    def _collect(self, reports: dict[int, Report]) -> None:
        """Wait for every rank's report; on the first failure, abort the rest."""
        while len(reports) < self.world_size:
            failures = [r for r in self._receive(reports) if r.kind != "result"]
            if failures:  # the ranks that had returned by now took no part in what failed
                self._returned_first = [r.rank for r in reports.values() if r.kind == "result"]
                return self._stop(reports, abort_error(failures[0]))

    def _receive(self, reports: dict[int, Report]) -> list[Report]:
        """Add the reports that arrive within a short wait to `reports`; return them."""
        new = [r for r in self._world.wait(0.05, self._run_id) if r.rank not in reports]
        for report in new:
            reports[report.rank] = report
            if report.kind == "died":
                self._dead.add(report.rank)
        return new

    def _stop(self, reports: dict[int, Report], error: CollectiveError) -> list[int]:
        """Abort the collective on every rank still running;
        kill (and replace) any that does not stop.

        Returns the ranks that did not stop in time (all ranks are then fresh processes)."""
        self._world.abort(error)
        start = time.monotonic()
        while len(reports) < self.world_size and time.monotonic() < start + GRACE:
            self._receive(reports)
            if (time.monotonic() > start + ANSWER
                    and set(range(self.world_size)) - set(reports) <= set(_waited_for(reports))):
                break  # the only ranks left are ones the others already waited a deadline for
        stuck = [rank for rank in range(self.world_size) if rank not in reports]
        waited = _waited_for(reports)
        for rank in stuck:
            reports[rank] = Report(rank, self._run_id, kind="stuck", error=CollectiveTimeout(
                (f"rank {rank} did not answer: rank(s) "
                 f"{', '.join(str(r) for r in sorted(waited[rank]))} waited for it in the "
                 f"collective past their deadline; it is stopped (a debugger, Ctrl-Z, SIGSTOP) "
                 f"or busy (a long computation, before the collective or inside it)"
                 if rank in waited else
                 f"rank {rank} was busy outside any collective while the others gave up on it "
                 f"({error}); it did not stop within {GRACE:.0f} s")
                + ", so the Cluster replaced all ranks", ranks=(rank,)))
        if stuck:
            self._world.kill(stuck)  # they do not answer: replacing them need not wait for them
            self.restart()
        return stuck


ANSWER = 1.5  # seconds within which a rank waiting in a collective answers an abort, busy or not


def _waited_for(reports: dict[int, Report]) -> dict[int, set[int]]:
    """rank -> the ranks whose collective wait for it ran past their deadline."""
    waited: dict[int, set[int]] = {}
    for r in reports.values():
        if isinstance(r.error, CollectiveTimeout) and r.error.waiting_for is not None:
            waited.setdefault(r.error.waiting_for, set()).add(r.rank)
    return waited


def _interrupted(fn, running: list[int], replaced: list[int], world_size: int,
                 transport: str, handed: bool = True) -> str:
    """The one paragraph a learner reads after interrupting cluster.run:
    what stopped, what was replaced."""
    name = getattr(fn, "__name__", "fn")
    if not handed and replaced:  # the ranks without the call never report: replaced, not stuck
        return (f"cluster.run({name}) was interrupted while the call was handed to the ranks: "
                f"those that had it stopped, and all {world_size} ranks were replaced by fresh "
                f"processes (new PIDs and ports); the cluster is ready for the next run.")
    if not running:
        return (f"cluster.run({name}) was interrupted after every rank had finished; "
                f"the cluster is ready.")
    ranks = ", ".join(map(str, running))
    if not replaced:
        return (f"cluster.run({name}) was interrupted: rank(s) {ranks} stopped their collective; "
                f"the same {world_size} rank processes are ready for the next run.")
    fresh = ("processes (new PIDs and ports)" if TRANSPORTS[transport].processes
             else "threads (a thread cannot be killed: the stuck one runs on, detached)")
    return (f"cluster.run({name}) was interrupted: rank(s) {', '.join(map(str, replaced))} "
            f"did not stop within {GRACE:g} s (busy outside any collective), "
            f"so all {world_size} ranks were replaced by fresh {fresh}; "
            f"the cluster is ready for the next run.")
