"""Bruck's reduce-scatter and all-gather: NumPy's answers for any N, in ⌈log2 N⌉ steps (from the trace), with the
ring's bytes; chosen by name in reduce_scatter(), all_gather() and their non-blocking twins."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import DTYPES, REFERENCE, cluster_for, contribution
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import allreduce_edu as ae
from allreduce_edu.collectives import ALL_GATHERS, OPS, REDUCE_SCATTERS
from allreduce_edu.model import costmodel
from allreduce_edu.viz import CircleAnimation, animate
from allreduce_edu.viz.replay import replay


def _halves(comm, rows, op, dtype, seed, algorithm):
    x = contribution(comm.rank, (rows, 3), dtype, seed)
    before = x.copy()
    mine = ae.reduce_scatter(comm, x, op=op, algorithm=algorithm)
    assert np.array_equal(x, before), "the caller's input was modified"
    varying = np.full((comm.rank % 3, 2), comm.rank, dtype=dtype)  # lengths differ, some are 0
    return mine, ae.all_gather(comm, mine, algorithm=algorithm), ae.all_gather(comm, varying, algorithm=algorithm)


def check_halves(cluster, rows, op, dtype, seed=0, algorithm="bruck"):
    n = cluster.world_size
    stacked = np.stack([contribution(r, (rows, 3), dtype, seed) for r in range(n)])
    full = REFERENCE[op](stacked.astype(np.float64) if stacked.dtype.kind == "f" else stacked, axis=0)
    pieces = np.array_split(full, n, axis=0)
    for rank, (mine, gathered, varying) in enumerate(cluster.run(_halves, rows, op, dtype, seed, algorithm)):
        assert mine.shape == pieces[rank].shape and mine.dtype == np.dtype(dtype)
        np.testing.assert_allclose(mine, pieces[rank], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(gathered, full, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(varying, np.concatenate([np.full((r % 3, 2), r) for r in range(n)]))


@st.composite
def cases(draw):
    n = draw(st.integers(1, 9))
    rows = draw(st.sampled_from([0, 1, max(n - 1, 0), n, n + 1, 13, 31]))
    return n, rows, draw(st.sampled_from(sorted(OPS))), draw(st.sampled_from(DTYPES)), draw(st.integers(0, 2**16))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_every_op_dtype_size_and_world_local(case):
    n, rows, op, dtype, seed = case
    check_halves(cluster_for("local", n), rows, op, dtype, seed)


@pytest.mark.processes
@pytest.mark.parametrize("processes", ["grpc", "shm"])
@pytest.mark.parametrize("n", [3, 5, 8])
def test_process_transports(processes, n):
    cluster = cluster_for(processes, n)
    check_halves(cluster, 2 * n + 1, "sum", "float64")
    check_halves(cluster, 70_001, "max", "float32")  # big enough for shared-memory segments


def _gather(comm, count):
    return ae.all_gather(comm, np.full(count, comm.rank, np.int32), algorithm="bruck")


@pytest.mark.parametrize("n", range(1, 10))
def test_log2_steps_and_the_rings_bytes(n):
    cluster = cluster_for("local", n)
    count = 12
    cluster.run(_gather, count)
    events = [e for e in cluster.trace.events if e.tag == "all_gather"]
    assert {e.step for e in events} == set(range(math.ceil(math.log2(n)) if n > 1 else 0))
    assert all(sum(e.src == r for e in events) == math.ceil(math.log2(n)) for r in range(n) if n > 1)
    sent = {r: sum(e.nbytes for e in events if e.src == r) for r in range(n)}
    assert all(b == (n - 1) * count * 4 for b in sent.values())  # (N-1)/N of the gathered bytes, as the ring
    cluster.run(lambda comm: ae.reduce_scatter(comm, np.ones(n * count, np.int32), algorithm="bruck"))
    events = cluster.trace.events
    assert {e.step for e in events} == set(range(math.ceil(math.log2(n)) if n > 1 else 0))
    assert all(sum(e.nbytes for e in events if e.src == r) == (n - 1) * count * 4 for r in range(n))


@pytest.mark.parametrize("n", [3, 5, 6, 7])
def test_the_all_reduce_replays_and_animates_on_a_circle(n):
    cluster = cluster_for("local", n)
    x = [np.arange(2 * n + 1.0) + 100 * r for r in range(n)]
    results = cluster.run(lambda comm: ae.allreduce(comm, x[comm.rank], algorithm="bruck"))
    assert all(np.array_equal(y, sum(x)) for y in results)
    states = replay(cluster.trace, n, values=x)
    assert len(states) == 1 + 2 * math.ceil(math.log2(n))
    # from N = 4 on, some runs of chunks wrap past the last one
    assert any(e.chunk[0] < 0 for e in cluster.trace.events) == (n > 3)
    everyone = frozenset(range(n))
    reduced = [s for s in states if s.phase == "reduce_scatter"][-1]
    assert [[c for c, ranks in enumerate(row) if ranks == everyone] for row in reduced.held] == [[r] for r in range(n)]
    assert all(ranks == everyone for row in states[-1].held for ranks in row)
    assert np.array_equal(np.concatenate(states[-1].values[0]), sum(x))
    view = animate(cluster, values=x)
    assert isinstance(view, CircleAnimation) and view.data["edges"] == [] and not view.directed
    assert view.frame(1).startswith(b"\x89PNG")


def test_the_formulas_are_logarithmic_with_the_rings_bytes():
    alpha, beta = 1e-4, 1e-9
    for n in (3, 8, 9):
        s = 1 << 20
        assert costmodel.all_gather_bruck(n, s, alpha, beta) - costmodel.all_gather_ring(n, s, alpha, beta) == (
            pytest.approx((math.ceil(math.log2(n)) - (n - 1)) * alpha))
        assert costmodel.predict("bruck", n, s, alpha, beta) == pytest.approx(
            costmodel.reduce_scatter_bruck(n, s, alpha, beta) + costmodel.all_gather_bruck(n, s, alpha, beta))


def _unknown(comm, which):
    x = np.ones(4)
    return (ae.reduce_scatter(comm, x, algorithm="butterfly") if which == "rs"
            else ae.all_gather(comm, x, algorithm="butterfly"))


@pytest.mark.parametrize("which", ["rs", "ag"])
def test_an_unknown_algorithm_is_refused_before_any_message(which):
    cluster = cluster_for("local", 3)
    with pytest.raises(ValueError, match="'butterfly'.*ring, bruck"):
        cluster.run(_unknown, which)
    assert len(cluster.trace) == 0
    assert set(REDUCE_SCATTERS) == set(ALL_GATHERS) == {"ring", "bruck"}


def _disagree(comm):
    return ae.all_gather(comm, np.ones(4), algorithm="ring" if comm.rank == 2 else "bruck")


def test_ranks_disagreeing_on_the_algorithm_raise_mismatch(transport):
    with pytest.raises(ae.CollectiveMismatch) as info:
        cluster_for(transport, 4).run(_disagree)
    assert "algorithm='ring'" in str(info.value) and "algorithm='bruck'" in str(info.value)


def _nonblocking(comm):
    x = np.arange(8.0) + comm.rank
    requests = [ae.ireduce_scatter(comm, x, algorithm="bruck"), ae.iall_gather(comm, x[:2], algorithm="bruck")]
    return ae.wait_all(requests)


def test_the_non_blocking_twins_take_the_algorithm():
    n = 3
    for rank, (mine, gathered) in enumerate(cluster_for("local", n).run(_nonblocking)):
        full = sum(np.arange(8.0) + r for r in range(n))
        np.testing.assert_array_equal(mine, np.array_split(full, n)[rank])
        np.testing.assert_array_equal(gathered, np.concatenate([np.arange(2.0) + r for r in range(n)]))
