"""The life of every rank process the package starts:
set up, connect, run what arrives, report back."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import cloudpickle
import setproctitle

from ..comm.errors import CollectiveError
from .osfacts import die_with, exit_when_gone, usable_cpus

# seconds a process gets to stop when asked (an aborted rank, a SIGTERMed one) before it is killed
GRACE = 3.0


@dataclass
class Report:
    """What a rank sends back after a run:
    its value or its error, its trace events and its output."""

    rank: int
    run_id: int
    value: object = None
    error: BaseException | None = None
    traceback: str = ""
    events: list = field(default_factory=list)
    receives: list = field(default_factory=list)
    dropped: int = 0  # trace events not recorded (the trace was full)
    output: str = ""
    kind: str = "result"  # "result" | "error" | "died" | "stuck"


def execute(comm, run_id: int, payload: bytes, output: io.StringIO) -> Report:
    """Run a shipped `fn(comm, *args, **kwargs)` on this rank and report how it went
    (after `comm.begin_run`)."""
    try:
        fn, args, kwargs = cloudpickle.loads(payload)
        try:
            value = fn(comm, *args, **kwargs)
        except BaseException:  # its own error is the run's; requests still running finish here
            comm.drain(report=False)
            raise
        comm.drain()  # they finish here, not in the next run; a failure nobody waited for is raised
        report = Report(comm.rank, run_id, value=value)
    except BaseException as e:  # noqa: BLE001 - everything goes to the caller, with its traceback
        report = Report(comm.rank, run_id, error=e, traceback=traceback.format_exc(), kind="error")
    report.events, report.receives = list(comm.trace.events), list(comm.trace.receives)
    report.dropped = comm.trace.dropped
    report.output = output.getvalue()
    return report


def serialise_error(report: Report) -> Report:
    """Make the report's error picklable (it crosses a pipe); fall back to a description."""
    try:
        cloudpickle.dumps(report.error)
    except Exception:  # noqa: BLE001 - whatever fails to pickle falls back to a description
        report.error = RuntimeError(f"{type(report.error).__name__}: {report.error}")
    return report


class DeferredLog(logging.Handler):
    """Keeps this rank's log lines until the next run reports,
    so they print with it, prefixed by rank."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(message)s"))

    def emit(self, record) -> None:
        self.lines.append(self.format(record))

    def take(self) -> str:
        lines, self.lines = self.lines, []
        return "".join(line + "\n" for line in lines)


LOG = DeferredLog()


def become_rank(rank: int, world_size: int, parent: int | None, role: str, *,
                interruptible: bool = False, sharing: int | None = None) -> None:
    """What every rank process does first: show as `allreduce-edu rank R/N (role)` in ps,
    share the cores with the `sharing` ranks of this machine (default: all), hand the GIL over
    often, exit when `parent` (the pid that started it) is gone; unless `interruptible` (a launched
    script), also survive the notebook's Ctrl-C and keep its logs for its next report."""
    setproctitle.setproctitle(f"allreduce-edu rank {rank}/{world_size} "
                              f"({role}; parent pid {parent or '-'})")
    if not interruptible:
        # "interrupt kernel" signals the whole group: the caller copes
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        logger = logging.getLogger("allreduce_edu")
        logger.addHandler(LOG)
        # never to the inherited stderr: in Jupyter it would land in whichever cell runs
        logger.propagate = False
    # ranks share this machine's cores: give each rank's Numba kernels its share, not all of them
    share = max(1, usable_cpus() // (sharing or world_size))
    os.environ.setdefault("NUMBA_NUM_THREADS", str(share))
    sys.setswitchinterval(2e-4)  # hand the GIL over often: gRPC threads and the algorithm share it
    if parent:
        die_with(parent)
        threading.Thread(target=exit_when_gone, args=(parent,), name="parent-watch",
                         daemon=True).start()


def main(start) -> None:
    """The one entry point of every rank process the package starts: `start` says how it connects.

    ClusterStart: a Cluster's rank, a gRPC server that runs what arrives over its pipe
    until told to close.
    EngineStart (`python -m allreduce_edu.runtime FOLDER`): an MPI or gloo rank of
    run_on_engine, which runs the one call in FOLDER, on its main thread, and reports there.
    """
    comm = start.connect()
    if comm is None:
        return
    for kind, body in start.commands():
        if kind == "run":
            run_id, epoch, payload = body
            # here, not in the worker: an abort that follows must not be undone
            comm.begin_run(epoch)
            if start.one_shot:  # an engine rank: on the main thread, as engines want it
                _run(comm, run_id, payload, start.reply)
                continue
            worker = threading.Thread(target=_run, args=(comm, run_id, payload, start.reply),
                                      name=f"rank{comm.rank}-run{run_id}", daemon=True)
            worker.start()
        elif kind == "abort":
            comm.abort(body)
    start.close(comm)


def _run(comm, run_id: int, payload: bytes, reply) -> None:
    output = io.StringIO(LOG.take())  # what the rank logged since the last run comes first
    output.seek(0, io.SEEK_END)
    # one run at a time per process: the caller prints it prefixed by rank
    sys.stdout = sys.stderr = output
    try:
        report = execute(comm, run_id, payload, output)
    finally:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    try:  # cloudpickle: results and errors of classes defined in a notebook come back too
        blob = cloudpickle.dumps(serialise_error(report))
    except Exception as e:  # noqa: BLE001 - e.g. a result that cannot be pickled
        report = Report(comm.rank, run_id, error=TypeError(
            f"rank {comm.rank}: the function's result cannot be sent back to the caller: {e}"),
            kind="error", output=report.output)
        blob = cloudpickle.dumps(report)
    reply(report, blob)


def start_wait(timeout: float) -> float:
    """How long a Cluster waits for every rank to start (and to connect), and a rank for its
    peers' addresses: the communicator's timeout, and never under a minute."""
    return max(60.0, timeout)


def _why(error: Exception) -> str:
    """A start-up failure as the caller's RankFailure tells it: the error, and for one the
    package does not expect (not the OS's, gRPC's or a refused value), its traceback too."""
    if isinstance(error, (OSError, RuntimeError, ValueError)):
        return f"{type(error).__name__}: {error}"
    return "".join(traceback.format_exception(error)).rstrip()


class ClusterStart:
    """How a Cluster's rank starts: serve gRPC, tell the parent its address,
    connect to the peers it hands out."""

    one_shot = False

    def __init__(self, rank, world_size, token, host, timeout, conn, tls=None, links=None,
                 transport=None, scratch=None):
        self.rank, self.world_size, self.token, self.scratch = rank, world_size, token, scratch
        self.host, self.timeout, self.transport = host, timeout, transport
        self.conn, self.tls, self.links = conn, tls, links

    def send(self, item) -> None:
        with self._lock:
            self.conn.send(item)

    def connect(self):
        self._lock = threading.Lock()  # made here: a lock cannot travel to the new process
        become_rank(self.rank, self.world_size, os.getppid(), "cluster")
        # the transport's row (runtime/transports.py) says how a rank builds its communicator
        try:
            comm = self.transport.communicator(self.rank, self.world_size, token=self.token,
                                               host=self.host, timeout=self.timeout,
                                               tls=self.tls, scratch=self.scratch)
        except Exception as e:  # noqa: BLE001 - the caller's cell shows it, not this stderr
            self.send(("failed", _why(e)))
            return None
        comm.use_links(self.links)
        self.send(("ready", comm.address))
        try:  # the Cluster waits as long for every rank's "ready", then gives up
            kind, addresses = (self.conn.recv() if self.conn.poll(start_wait(self.timeout) + 10)
                               else ("close", None))
        except (EOFError, OSError):  # the Cluster is gone
            kind = "close"
        if kind != "peers":  # the Cluster gave up starting (Ctrl-C, a rank that failed): stop
            comm.close(drain=0.0)
            return None
        try:
            comm.connect(addresses)
        except Exception as e:  # noqa: BLE001 - a CollectiveError, or what else stopped it
            self.send(("failed", str(e) if isinstance(e, CollectiveError) else _why(e)))
            comm.close(drain=0.0)
            return None
        self.send(("connected", None))
        return comm

    def commands(self):
        """What the parent sends, until it says close or is gone."""
        while True:
            try:
                if not self.conn.poll(1.0):
                    continue
                kind, body = self.conn.recv()
            except (EOFError, OSError):
                return  # the parent is gone
            if kind == "close":
                return
            yield kind, body

    def reply(self, report: Report, blob: bytes) -> None:
        self.send(("report", blob))

    def close(self, comm) -> None:
        comm.close()
        os._exit(0)  # do not wait for a user thread that may be stuck


class EngineStart:
    """How a rank of run_on_engine starts:
    the engine's own communicator, one call from FOLDER, a report there."""

    one_shot = True

    def __init__(self, folder: str):
        self.folder = Path(folder)
        self.spec = json.loads((self.folder / "spec.json").read_text())
        self.ok = False

    def connect(self):
        env = os.environ
        rank = int(env.get("RANK") or env.get("OMPI_COMM_WORLD_RANK") or 0)  # until the comm says
        world_size = int(env.get("WORLD_SIZE") or env.get("OMPI_COMM_WORLD_SIZE") or 1)
        become_rank(rank, world_size, os.getppid(), f"{self.spec['engine']} engine")
        try:
            if self.spec["engine"] == "mpi":
                from ..comm.transports.engine.mpi import MPICommunicator
                return MPICommunicator(timeout=self.spec["comm_timeout"])
            from ..comm.transports.engine.torch_dist import TorchCommunicator
            return TorchCommunicator(timeout=self.spec["comm_timeout"])
        except BaseException as e:  # noqa: BLE001 - reported like a failed run, with its traceback
            report = Report(rank, 0, error=e, traceback=traceback.format_exc(), kind="error")
            self.reply(report, cloudpickle.dumps(serialise_error(report)))
            os._exit(1)

    def commands(self):
        yield "run", (0, 0, (self.folder / "call.pkl").read_bytes())

    def reply(self, report: Report, blob: bytes) -> None:
        path = self.folder / f"rank{report.rank:05d}.pkl"
        path.with_suffix(".tmp").write_bytes(blob)
        path.with_suffix(".tmp").rename(path)  # whole, or not at all
        self.ok = report.kind == "result"

    def close(self, comm) -> None:
        if not self.ok:
            os._exit(1)  # the launcher (or mpirun) stops the other ranks at once
        comm.barrier()  # nobody leaves while a peer may still read from it
        comm.close()
