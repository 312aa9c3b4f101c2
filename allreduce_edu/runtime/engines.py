"""Run a notebook's function on a real engine: MPI (mpirun) or torch.distributed (gloo). Lesson 09.

    results = run_on_engine(fn, "gloo", 3)  # fn(comm) on 3 processes; comm is a TorchCommunicator

The call travels by value (cloudpickle, as Cluster ships it) in a file of a private temporary
folder; each rank writes its result or its error, with traceback and printed output, to a file
of its own there.
Pickles only ever pass through local files between this process and the ranks it started.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import cloudpickle
import numpy as np

from .failures import print_outputs, root_cause
from .limits import check_world_size
from .osfacts import new_group, stop_group
from .rules import seconds
from .shipping import ship
from .worker import GRACE

ENGINES = ("mpi", "gloo")
# seconds a launcher gets after SIGTERM (it gives its ranks GRACE) before it is killed
STOP = 2 * GRACE + 2


def missing(engine: str) -> str:
    """Why `engine` cannot run here, with the fix ("" when it can)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; valid: {', '.join(ENGINES)}")
    module, extra = ("torch", "torch") if engine == "gloo" else ("mpi4py", "mpi")
    if not importlib.util.find_spec(module):
        return f"{module} is not installed (pip install 'allreduce-edu[{extra}]')"
    if engine == "mpi" and not shutil.which("mpirun"):
        return "mpirun is not on PATH (apt-get install openmpi-bin libopenmpi-dev)"
    return ""


def engine_available(engine: str) -> bool:
    """True when `run_on_engine(fn, engine)` can start processes here."""
    return not missing(engine)


def run_on_engine(fn, engine: str = "mpi", world_size: int = 3, *args, timeout: float = 120.0,
                  comm_timeout: float | None = None) -> list:
    """Call `fn(comm, *args)` on `world_size` new `engine` processes:
    the results by rank, or the failing rank's error."""
    # past `timeout` seconds every process is killed;
    # `comm_timeout` bounds each wait for a peer (≤ 30 s by default)
    timeout = seconds("timeout", timeout)  # inf overflows a wait; a negative one kills at once
    comm_timeout = (min(30.0, timeout / 3) if comm_timeout is None
                    else seconds("comm_timeout", comm_timeout))
    if missing(engine):
        raise RuntimeError(f"cannot run on {engine}: {missing(engine)}")
    check_world_size(world_size)  # mpirun --oversubscribe would start any number
    with tempfile.TemporaryDirectory(prefix="allreduce-edu-engine-") as folder:
        Path(folder, "call.pkl").write_bytes(ship(fn, args, {}))
        Path(folder, "spec.json").write_text(json.dumps({"engine": engine,
                                                         "comm_timeout": comm_timeout}))
        entry = ["-m", "allreduce_edu.runtime", folder]
        if engine == "mpi":
            from ..comm.transports.engine.mpi import mpirun_command
            command = mpirun_command(world_size) + [sys.executable, *entry]
        else:
            # the package's launcher sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, like torchrun
            command = [sys.executable, "-m", "allreduce_edu.cli", "launch", "-n", str(world_size),
                       *entry]
        code, stderr = _run(command, timeout)
        reports = {r.rank: r for r in (cloudpickle.loads(p.read_bytes())
                                       for p in Path(folder).glob("rank*.pkl"))}
    print_outputs(reports)
    name = getattr(fn, "__name__", repr(fn))
    failures = sorted((r for r in reports.values() if r.kind != "result"), key=lambda r: r.rank)
    if failures:
        raise root_cause(failures, fn, where=f"run_on_engine({name}) over {engine}")
    if code is None:
        raise TimeoutError(f"run_on_engine({name}) over {engine} did not finish within "
                           f"{timeout:g} s; every process was stopped. "
                           f"Is a rank waiting for a message no one sends?")
    if code or len(reports) != world_size:
        raise RuntimeError(f"{engine}'s processes failed (exit code {code}, {len(reports)} of "
                           f"{world_size} ranks reported):\n{stderr.strip()[-2000:]}")
    return [reports[rank].value for rank in range(world_size)]


def _run(command: list[str], timeout: float) -> tuple[int | None, str]:
    """Run `command` in a session of its own: (exit code, stderr);
    (None, stderr) after killing it all at timeout."""
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, **new_group(),
                            env=dict(os.environ, PYTHONWARNINGS="ignore"))
    code, stderr = None, b""
    try:
        stderr, code = proc.communicate(timeout=timeout)[1], proc.returncode
    except subprocess.TimeoutExpired:
        pass
    finally:
        for hard, grace in ((False, STOP), (True, 5.0)):
            if proc.poll() is None:  # asked first: the launcher and mpirun then stop their ranks
                stop_group(proc, hard)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    stderr += proc.communicate(timeout=grace)[1] or b""
    return code, stderr.decode(errors="replace")


def compare_with_builtin(fn, engine: str = "mpi", world_size: int = 3, sizes=(10, 1_000_003),
                         dtypes=("float32", "int64"), timeout: float = 120.0) -> list[dict]:
    """Run `fn(comm, x)` and the engine's own all-reduce on the same rank-derived x;
    one row per (dtype, size)."""
    blob = ship(fn, (), {})  # fn by value even where it is an argument (a test's, a script's)
    per_rank = run_on_engine(_compare_on_rank, engine, world_size, blob, list(sizes), list(dtypes),
                             timeout=timeout)
    # one row per (dtype, size), over all ranks
    return [dict(rows[0], max_error=max(r["max_error"] for r in rows),
                 ok=all(r["ok"] for r in rows), engine=engine, world_size=world_size)
            for rows in zip(*per_rank, strict=True)]


def rank_input(rank: int, size: int, dtype: str) -> np.ndarray:
    """Rank-derived data: seeded random floats (sums round by order)
    or integers of every sign (sums are exact)."""
    rng = np.random.default_rng(1000 + rank)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(size).astype(dtype)
    return rng.integers(-1000, 1000, size).astype(dtype) + rank


def _compare_on_rank(comm, blob: bytes, sizes, dtypes) -> list[dict]:
    fn, rows = cloudpickle.loads(blob)[0], []
    for dtype in dtypes:
        for size in sizes:
            x = rank_input(comm.rank, size, dtype)
            ours, engine = np.asarray(fn(comm, x.copy())), comm.builtin_allreduce(x)
            same = ours.shape == engine.shape and ours.dtype == engine.dtype
            error = (float(np.max(np.abs(ours.astype(np.float64) - engine), initial=0.0)) if same
                     else float("inf"))
            ok = same and (np.allclose(ours, engine, rtol=1e-5, atol=1e-5)
                           if dtype.startswith("float") else np.array_equal(ours, engine))
            rows.append({"dtype": dtype, "size": size, "max_error": error, "ok": bool(ok)})
    return rows


def format_comparison(rows: list[dict]) -> str:
    """The rows of compare_with_builtin as a small table."""
    head = f"{'dtype':>8} {'elements':>10}  {'max |ours − ' + rows[0]['engine'] + '|':>18}  agree"
    return "\n".join([head] + [f"{r['dtype']:>8} {r['size']:>10,}  {r['max_error']:>18.3g}  "
                               f"{'✓' if r['ok'] else '✗'}" for r in rows])
