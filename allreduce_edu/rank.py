"""The life of one rank process: serve gRPC, rendezvous, then run whatever the Cluster sends."""

from __future__ import annotations

import io
import logging
import os
import signal
import sys
import threading
import traceback
from dataclasses import dataclass, field

import cloudpickle

from .comm.errors import CollectiveError


@dataclass
class Report:
    """What a rank sends back after a run: its value or its error, its trace events and its output."""

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
    """Run a shipped `fn(comm, *args, **kwargs)` on this rank and report how it went (after `comm.begin_run`)."""
    try:
        fn, args, kwargs = cloudpickle.loads(payload)
        report = Report(comm.rank, run_id, value=fn(comm, *args, **kwargs))
    except BaseException as e:  # noqa: BLE001 - everything goes back to the caller, with its traceback
        report = Report(comm.rank, run_id, error=e, traceback=traceback.format_exc(), kind="error")
    report.events, report.receives = list(comm.trace.events), list(comm.trace.receives)
    report.dropped = comm.trace.dropped
    report.output = output.getvalue()
    return report


def serialise_error(report: Report) -> Report:
    """Make the report's error picklable (it crosses a pipe); fall back to a description."""
    try:
        cloudpickle.dumps(report.error)
    except Exception:  # noqa: BLE001
        report.error = RuntimeError(f"{type(report.error).__name__}: {report.error}")
    return report


class DeferredLog(logging.Handler):
    """Keeps this rank's log lines until the next run reports, so they print with it, prefixed by rank."""

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


def main(rank: int, world_size: int, token: str, host: str, timeout: float, conn, tls=None, links=None) -> None:
    """Entry point of a spawned rank (multiprocessing target)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # "interrupt kernel" signals the whole group: the Cluster handles it
    # ranks share this machine's cores: give each rank's Numba kernels its share, not all of them
    os.environ.setdefault("NUMBA_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world_size)))
    logger = logging.getLogger("allreduce_edu")
    logger.addHandler(LOG)
    logger.propagate = False  # never to the inherited stderr: in Jupyter it would land in whichever cell runs
    sys.setswitchinterval(2e-4)  # hand the GIL over often: gRPC threads and the algorithm share it
    from .comm.grpc import GrpcCommunicator

    parent = os.getppid()
    send_lock = threading.Lock()

    def send(item) -> None:
        with send_lock:
            conn.send(item)

    comm = GrpcCommunicator(rank, world_size, token=token, host=host, timeout=timeout, tls=tls)
    comm.links = links
    send(("ready", comm.address))
    kind, addresses = conn.recv()
    try:
        comm.connect(addresses)
    except CollectiveError as e:
        send(("failed", str(e)))
        return
    send(("connected", None))
    worker: threading.Thread | None = None
    while True:
        try:
            if not conn.poll(1.0):
                if os.getppid() != parent:  # the parent died without closing us: leave no orphan
                    break
                continue
            kind, body = conn.recv()
        except (EOFError, OSError):
            break  # the parent is gone
        if kind == "run":
            run_id, epoch, payload = body
            comm.begin_run(epoch)  # here, not in the worker: an abort that follows must not be undone
            worker = threading.Thread(target=_run, args=(comm, run_id, payload, send),
                                      name=f"rank{rank}-run{run_id}", daemon=True)
            worker.start()
        elif kind == "abort":
            comm.abort(body)
        elif kind == "close":
            break
    comm.close()
    os._exit(0)  # do not wait for a user thread that may be stuck


def _run(comm, run_id: int, payload: bytes, send) -> None:
    output = io.StringIO(LOG.take())  # what the rank logged since the last run comes first
    output.seek(0, io.SEEK_END)
    sys.stdout = sys.stderr = output  # one run at a time per process: the Cluster prints it prefixed by rank
    try:
        report = execute(comm, run_id, payload, output)
    finally:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    try:  # cloudpickle: results and errors of classes defined in a notebook come back too
        send(("report", cloudpickle.dumps(serialise_error(report))))
    except Exception as e:  # noqa: BLE001 - e.g. a result that cannot be pickled
        send(("report", cloudpickle.dumps(Report(comm.rank, run_id, error=TypeError(
            f"rank {comm.rank}: the function's result cannot be sent back to the caller: {e}"),
            kind="error", output=report.output))))
