"""Ranks as spawned processes, each a gRPC server; the parent talks to each over a pipe."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import queue
import sys
import threading
import time

import cloudpickle

from ..comm.errors import CollectiveError, RankFailure
from .osfacts import signal_name
from .shipping import ship
from .worker import ClusterStart, Report, main, start_wait

GUARD_HINT = ("Rank processes are started with 'spawn', which re-imports your script in every "
              "rank. Put the code that creates the Cluster under\n\n"
              "    if __name__ == \"__main__\":\n\n"
              "so the ranks do not start clusters of their own.")


_SPAWNS: queue.SimpleQueue = queue.SimpleQueue()  # (proc, done, errors) for the spawner thread
_SPAWNER: list[threading.Thread] = []
_SPAWNER_LOCK = threading.Lock()


def started(proc) -> None:
    """Start `proc` from a thread that lives as long as this process: the kernel kills a rank when
    the thread that started it ends (osfacts.die_with), so never from a thread that may end first
    (a notebook's worker thread, a test's pool). A daemon thread is never joined, not even at
    exit, where the Cluster's finaliser still closes its ranks gently."""
    if threading.current_thread() is threading.main_thread():
        return proc.start()
    with _SPAWNER_LOCK:
        if not _SPAWNER:
            _SPAWNER.append(threading.Thread(target=_spawn_forever, name="allreduce-edu-spawner",
                                             daemon=True))
            _SPAWNER[0].start()
    done, errors = threading.Event(), []
    _SPAWNS.put((proc, done, errors))
    done.wait()
    if errors:
        raise errors[0]


def _spawn_forever() -> None:
    while True:
        proc, done, errors = _SPAWNS.get()
        try:
            proc.start()
        except BaseException as e:  # noqa: BLE001 - raised on the thread that asked
            errors.append(e)
        done.set()


class ProcessRanks:
    """One spawned process per rank, each a gRPC server; the parent talks to each over a pipe.
    `transport` is the row of runtime/transports.py its ranks build their communicators by."""

    def __init__(self, world_size: int, token: str, host: str, timeout: float, tls=None,
                 links=None, transport=None):
        # never fork: gRPC and Numba's threads are not fork-safe
        ctx = multiprocessing.get_context("spawn")
        self.conns, self.procs = [], []
        # names of the ranks' shared memory, if it has names: swept at close, whatever ranks did
        self.scratch = transport.scratch() if transport.scratch else None
        try:  # from the first spawn: ranks started before a Ctrl-C or an error are stopped too
            for rank in range(world_size):
                parent_end, child_end = ctx.Pipe()
                self.conns.append(parent_end)
                try:
                    proc = ctx.Process(target=main, name=f"allreduce-edu-rank-{rank}",
                                       daemon=True,
                                       args=(ClusterStart(rank, world_size, token, host, timeout,
                                                          child_end, tls, links, transport,
                                                          self.scratch),))
                    started(proc)
                finally:
                    child_end.close()
                self.procs.append(proc)
            self.addresses = self._gather("ready", start_wait(timeout))
            for conn in self.conns:
                conn.send(("peers", self.addresses))
            self._gather("connected", start_wait(timeout))
        except KeyboardInterrupt:
            self.close()
            raise KeyboardInterrupt(f"interrupted while starting {world_size} rank processes: "
                                    f"every one was stopped, and no Cluster was made") from None
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
                raise RankFailure(f"ranks {sorted(set(range(len(self.procs))) - set(values))} "
                                  f"did not start within {timeout:.0f} s")
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
                    hint = GUARD_HINT if hasattr(sys.modules["__main__"], "__file__") else ""
                    raise RuntimeError(f"rank {rank} exited while starting "
                                       f"(exit code {proc.exitcode}). " + hint)
        return [values[r] for r in range(len(self.procs))]

    def submit(self, run_id: int, fn, args, kwargs) -> None:
        payload = ship(fn, args, kwargs)
        # before any rank starts: a dead one would leave the others waiting on it
        self.check_alive()
        for conn in self.conns:
            conn.send(("run", (run_id, run_id, payload)))

    def check_alive(self) -> None:
        """RankFailure naming the ranks that died since the last run (killed while idle, say)."""
        dead = [rank for rank, proc in enumerate(self.procs) if not proc.is_alive()]
        if dead:
            how = ", ".join(f"rank {r} (exit code {self.procs[r].exitcode})" for r in dead
                            if not isinstance(self.procs[r], _Closed))
            raise RankFailure(f"{how or 'ranks ' + str(dead)} died while idle; "
                              f"call cluster.restart() for a full world", ranks=tuple(dead))

    def wait(self, timeout: float, run_id: int) -> list[Report]:
        """Reports that arrived within `timeout`, plus a "died" report for each rank that exited."""
        reports = []
        live = [r for r, p in enumerate(self.procs) if not isinstance(p, _Closed)]
        ready = multiprocessing.connection.wait([self.conns[r] for r in live]
                                                + [self.procs[r].sentinel for r in live], timeout)
        for rank in live:
            conn = self.conns[rank]
            if conn in ready:
                try:
                    kind, body = conn.recv()
                except (EOFError, OSError):
                    continue
                report = cloudpickle.loads(body)
                if report.run_id == run_id:
                    reports.append(report)
        for rank in live:
            proc = self.procs[rank]
            if (proc.sentinel in ready and not proc.is_alive()
                    and not any(r.rank == rank for r in reports)):
                code = proc.exitcode
                how = (f"killed by {signal_name(code)}" if signal_name(code)
                       else f"exit code {code}")
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

    def kill(self, ranks) -> None:
        """End these ranks now: they stopped answering (SIGSTOPped, say), so asking is no use."""
        for rank in ranks:
            if self.procs[rank].is_alive():
                self.procs[rank].kill()

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
        if self.scratch is not None:
            self.scratch.sweep()


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
