"""run_on_engine: a function defined here (as in a notebook) runs on mpirun / gloo processes and comes back by rank."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from allreduce_edu.exercises import reference
from allreduce_edu.runtime import engines
from allreduce_edu.runtime.engines import (
    compare_with_builtin,
    engine_available,
    format_comparison,
    run_on_engine,
)

ring = reference("03.1")  # lesson 03's ring, as the course's reference solution writes it


def ring_and_builtin(comm, count):
    print(f"I am {type(comm).__name__}")
    x = np.arange(count, dtype=np.int64) * (comm.rank + 1)
    return ring(comm, x), comm.builtin_allreduce(x), comm.world_size


def fails_on_rank_1(comm):
    if comm.rank == 1:
        raise ValueError("rank 1 gives up")
    comm.recv(1, "never")  # the others wait for rank 1: they must be stopped, not left waiting


def sleeps(comm):
    time.sleep(600)


def need(engine):
    if not engine_available(engine):
        pytest.skip(f"{engine}: {engines.missing(engine)}")


needs_ps = pytest.mark.skipif(shutil.which("ps") is None, reason="lists processes with `ps`: POSIX only")


def engine_processes() -> list[str]:
    """Processes this machine runs for run_on_engine (ranks, launchers, mpirun)."""
    ps = subprocess.run(["ps", "-eo", "pid,args"], check=False, capture_output=True, text=True).stdout.splitlines()
    ours = [line for line in ps if "allreduce_edu.runtime " in line and sys.executable in line]  # launchers
    return ours + [line for line in ps if "allreduce-edu rank" in line and " engine;" in line]  # ranks, by title


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.parametrize("engine", engines.ENGINES)
def test_a_notebook_function_runs_on_three_engine_processes(engine, capsys):
    need(engine)
    results = run_on_engine(ring_and_builtin, engine, 3, 1001)
    expected = np.arange(1001, dtype=np.int64) * 6  # 1 + 2 + 3
    for rank, (ours, builtin, world_size) in enumerate(results):
        assert world_size == 3, rank
        np.testing.assert_array_equal(ours, expected)
        np.testing.assert_array_equal(builtin, expected)
    name = {"mpi": "MPICommunicator", "gloo": "TorchCommunicator"}[engine]
    assert capsys.readouterr().out.splitlines() == [f"[rank {r}] I am {name}" for r in range(3)]


@pytest.mark.slow
@pytest.mark.processes
@needs_ps
@pytest.mark.parametrize("engine", engines.ENGINES)
def test_a_failing_function_raises_with_its_rank_and_traceback(engine):
    need(engine)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="rank 1 gives up") as info:
        run_on_engine(fails_on_rank_1, engine, 3, timeout=60)
    assert time.monotonic() - t0 < 40  # the other ranks were stopped, not left to time out
    assert "raised on rank 1 in run_on_engine(fails_on_rank_1) over " + engine in info.value.__notes__
    remote = str(info.value.__cause__)
    assert "fails_on_rank_1" in remote and 'raise ValueError("rank 1 gives up")' in remote
    assert not engine_processes()


@pytest.mark.slow
@pytest.mark.processes
@needs_ps
@pytest.mark.parametrize("engine", engines.ENGINES)
def test_a_run_past_its_timeout_is_killed_and_leaves_no_process(engine):
    need(engine)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish within 8 s"):
        run_on_engine(sleeps, engine, 2, timeout=8)
    assert time.monotonic() - t0 < 8 + engines.STOP + 10
    time.sleep(1.0)  # ranks that lost their launcher notice within 0.5 s
    assert not engine_processes()


@pytest.mark.slow
@pytest.mark.processes
def test_compare_with_builtin_gives_a_row_per_dtype_and_size():
    engine = next((e for e in engines.ENGINES if engine_available(e)), None)
    if engine is None:
        pytest.skip("neither mpi nor gloo is installed")
    rows = compare_with_builtin(ring, engine, 3, sizes=(1, 10, 1001), dtypes=("float32", "int64"))
    assert [(r["dtype"], r["size"]) for r in rows] == [(d, s) for d in ("float32", "int64") for s in (1, 10, 1001)]
    assert all(r["ok"] and r["engine"] == engine and r["world_size"] == 3 for r in rows)
    assert all(r["max_error"] == 0 for r in rows if r["dtype"] == "int64")
    assert all(r["max_error"] < 1e-5 for r in rows)
    table = format_comparison(rows)
    assert table.count("✓") == 6 and f"max |ours − {engine}|" in table


def test_a_missing_engine_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert not engine_available("gloo") and not engine_available("mpi")
    assert "pip install 'allreduce-edu[torch]'" in engines.missing("gloo")
    assert "pip install 'allreduce-edu[mpi]'" in engines.missing("mpi")
    for engine in engines.ENGINES:
        with pytest.raises(RuntimeError, match=f"cannot run on {engine}: .*pip install"):
            run_on_engine(ring_and_builtin, engine, 3, 10)


def test_mpirun_missing_is_named(monkeypatch):
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py is not installed")
    monkeypatch.setenv("PATH", os.devnull)
    assert "mpirun is not on PATH" in engines.missing("mpi")


def test_an_unknown_engine_is_refused():
    with pytest.raises(ValueError, match="valid: mpi, gloo"):
        engine_available("nccl")


@pytest.mark.parametrize("kwargs, name", [({"timeout": float("inf")}, "timeout"), ({"timeout": -1}, "timeout"),
                                          ({"comm_timeout": float("nan")}, "comm_timeout")])
def test_a_timeout_that_is_no_number_of_seconds_is_refused_before_anything_starts(kwargs, name):
    with pytest.raises(ValueError, match=name):  # before the engine is even looked for
        run_on_engine(ring_and_builtin, "mpi", 2, 8, **kwargs)
