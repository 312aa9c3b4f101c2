"""The same algorithm code on other engines: MPI (mpi4py) and torch.distributed (gloo), each the other's oracle.

The engines are optional extras: their tests skip with the reason where one is missing. The envelope
logic they share is tested first on a tiny in-process engine, so it is covered everywhere.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import defaultdict, deque
from pathlib import Path

import numpy as np
import pytest

import allreduce_edu as ae
from allreduce_edu.comm.errors import CollectiveMismatch, CollectiveTimeout
from allreduce_edu.comm.transports.engine.communicator import EngineCommunicator

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "tests" / "comm" / "engine_scripts" / "check_engine.py"


class Wire:
    """What a minimal engine offers: FIFO queues per (src, dst, integer tag)."""

    def __init__(self):
        self.queues, self.cond = defaultdict(deque), threading.Condition()


class ToyEngine(EngineCommunicator):
    """An engine in one process (threads): just enough to exercise EngineCommunicator's envelopes."""

    engine = "toy"

    def __init__(self, wire: Wire, rank: int, world_size: int, tag_limit: int = 2**31 - 1, timeout: float = 5.0):
        super().__init__(rank, world_size, timeout)
        self.wire, self.tag_limit = wire, tag_limit

    def _isend(self, dst, tag, buffer):
        with self.wire.cond:
            self.wire.queues[(self.rank, dst, tag)].append(buffer.copy())
            self.wire.cond.notify_all()

    def _irecv(self, src, tag, buffer):
        return (src, tag, buffer)

    def _wait(self, handle, deadline):
        if handle is None:  # a send: done when queued
            return True
        src, tag, buffer = handle
        queue = self.wire.queues[(src, self.rank, tag)]
        with self.wire.cond:
            if not self.wire.cond.wait_for(lambda: queue, max(deadline - time.monotonic(), 0)):
                return False
            buffer[...] = queue.popleft()
        return True


def on_threads(world_size: int, fn, **engine_kwargs) -> list:
    """Run fn(comm) on `world_size` ToyEngine ranks; results (or exceptions) by rank."""
    wire = Wire()
    comms = [ToyEngine(wire, r, world_size, **engine_kwargs) for r in range(world_size)]
    results = [None] * world_size

    def run(comm):
        try:
            results[comm.rank] = fn(comm)
        except Exception as e:  # noqa: BLE001
            results[comm.rank] = e
    threads = [threading.Thread(target=run, args=(c,)) for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


@pytest.mark.parametrize("algorithm", ["ring", "tree", "recursive_doubling", "rabenseifner", "hierarchical", "naive"])
@pytest.mark.parametrize("n", [1, 3, 4])
def test_our_algorithms_run_unchanged_over_an_engines_point_to_point(algorithm, n):
    for dtype, shape in (("float32", (7, 3)), ("int64", (1009,)), ("float64", ())):
        inputs = [(np.arange(np.prod(shape, dtype=int)).reshape(shape) * (r + 1) + r).astype(dtype) for r in range(n)]
        results = on_threads(n, lambda comm, inputs=inputs: ae.allreduce(comm, inputs[comm.rank], "sum", algorithm))
        expected = np.sum(np.stack(inputs).astype(np.float64), axis=0).astype(dtype)
        for y in results:
            assert not isinstance(y, Exception), y
            assert y.dtype == expected.dtype and y.shape == expected.shape
            np.testing.assert_allclose(y, expected, rtol=1e-6)


def test_sends_and_receives_are_traced_like_the_builtin_transports():
    def run(comm):
        ae.allreduce(comm, np.arange(6.0), algorithm="ring")
        return comm.trace
    traces = on_threads(3, run)
    for rank, trace in enumerate(traces):
        assert [(e.src, e.tag, e.step) for e in trace.events] == \
            [(rank, t, s) for t in ("reduce_scatter", "all_gather") for s in (0, 1)]
        assert all(e.collective == "allreduce/ring" and e.nbytes == 16 for e in trace.events)
        assert len(trace.receives) == 4


def test_two_tags_on_one_integer_tag_fail_loudly_instead_of_crossing():
    def run(comm):
        if comm.rank == 0:
            comm.send(1, np.zeros(2), "first")
            comm.send(1, np.ones(2), "second")
        else:
            comm.recv(0, "second")  # both land on integer tag 0: "first" is next in line
    errors = on_threads(2, run, tag_limit=1)
    assert isinstance(errors[1], CollectiveMismatch) and "'second'" in str(errors[1])


def test_ranks_in_different_collectives_are_named():
    errors = on_threads(2, lambda comm: ae.allreduce(comm, np.ones(4), "sum" if comm.rank == 0 else "max"))
    assert any(isinstance(e, CollectiveMismatch) and "rank" in str(e) for e in errors), errors


def test_a_silent_peer_times_out_with_its_name():
    t0 = time.monotonic()
    errors = on_threads(2, lambda comm: comm.recv(1 - comm.rank, "never", timeout=0.3))
    assert time.monotonic() - t0 < 5
    assert isinstance(errors[0], CollectiveTimeout) and "from rank 1" in str(errors[0])


# --- the real engines ----------------------------------------------------------------------------
def _need(module: str, command: str | None = None) -> None:
    if importlib.util.find_spec(module) is None:
        extra = "torch" if module == "torch" else "mpi"
        pytest.skip(f"{module} is not installed (pip install 'allreduce-edu[{extra}]')")
    if command and shutil.which(command) is None:
        pytest.skip(f"{command} is not on PATH (apt-get install openmpi-bin libopenmpi-dev)")


def _mpirun(n: int, *args) -> subprocess.CompletedProcess:
    from allreduce_edu.comm.transports.engine.mpi import mpirun_command
    return subprocess.run(mpirun_command(n) + [sys.executable, str(CHECK), "mpi", *map(str, args)], cwd=ROOT,
                          check=False, capture_output=True, text=True, timeout=180)


def _gloo(n: int, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "allreduce_edu.cli", "launch", "-n", str(n), str(CHECK), "gloo",
                           *map(str, args)], cwd=ROOT, check=False, capture_output=True, text=True, timeout=180)


@pytest.mark.slow
@pytest.mark.parametrize("n, ranks_per_node", [(3, None), (4, 2)])
def test_our_algorithms_agree_with_mpi_allreduce(n, ranks_per_node):
    _need("mpi4py", "mpirun")
    result = _mpirun(n, *([ranks_per_node] if ranks_per_node else []))
    assert result.returncode == 0 and "MISMATCH" not in result.stdout, result.stdout + result.stderr
    assert f"ENGINE OK 96 checks on {n} ranks over mpi" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("n, ranks_per_node", [(3, None), (4, 2)])
def test_our_algorithms_agree_with_gloo_all_reduce(n, ranks_per_node):
    _need("torch")
    result = _gloo(n, *([ranks_per_node] if ranks_per_node else []))
    assert result.returncode == 0 and "MISMATCH" not in result.stdout, result.stdout + result.stderr
    assert f"ENGINE OK 96 checks on {n} ranks over gloo" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("peer, module, command", [("gloo", "torch", None), ("mpi", "mpi4py", "mpirun")])
def test_bench_prints_the_engines_rows_beside_ours(tmp_path, peer, module, command):
    _need(module, command)
    out = tmp_path / "rows.json"
    result = subprocess.run([sys.executable, "-m", "allreduce_edu.cli", "bench", "-n", "2", "--algorithm", "ring",
                             "--peer", peer, "-b", "1K", "-e", "64K", "-f", "64", "--iters", "3", "--warmup", "1",
                             "--json", str(out)], cwd=ROOT, check=False, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())
    assert [(r["algorithm"], r["bytes"]) for r in rows] == [(a, b) for a in ("ring", peer) for b in (1024, 65536)]
    assert all(r["wrong"] == 0 and r["time_us"] > 0 and r["world_size"] == 2 for r in rows)
    assert any(line.split()[3:4] == [peer] for line in result.stdout.splitlines() if line.strip())


def test_a_missing_engine_is_reported_not_crashed(monkeypatch):
    from allreduce_edu.bench import allreduce as bench
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    for peer in ("gloo", "mpi"):
        with pytest.raises(RuntimeError, match="pip install 'allreduce-edu"):
            bench.peer_rows(peer, 2, [8])
