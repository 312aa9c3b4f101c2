"""Traces prove each algorithm's cost: bytes per rank and steps per phase, counted from what was sent."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import cluster_for

import allreduce_edu as ae


def _allreduce(comm, count, algorithm):
    return ae.allreduce(comm, np.ones(count, np.float32), algorithm=algorithm)


@pytest.mark.parametrize("n", range(2, 9))
def test_ring_sends_2_n_minus_1_over_n_of_the_buffer_in_2_n_minus_1_messages(n):
    count = 840  # divisible by every N in 2..8
    cluster = cluster_for("local", n)
    cluster.run(_allreduce, count, "ring")
    size = count * 4
    assert cluster.trace.bytes_sent() == {r: 2 * (n - 1) * size // n for r in range(n)}
    assert cluster.trace.messages_sent() == {r: 2 * (n - 1) for r in range(n)}
    assert cluster.trace.steps() == {"reduce_scatter": n - 1, "all_gather": n - 1}


@pytest.mark.processes
def test_ring_volume_on_grpc_matches_local():
    cluster = cluster_for("grpc", 4)
    cluster.run(_allreduce, 1000, "ring")
    assert cluster.trace.bytes_sent() == {r: 2 * 3 * 4000 // 4 for r in range(4)}
    assert all(e.t_end >= e.t_start for e in cluster.trace)


@pytest.mark.parametrize("n", range(1, 10))
def test_tree_takes_ceil_log2_n_steps_per_phase(n):
    cluster = cluster_for("local", n)
    cluster.run(_allreduce, 10, "tree")
    steps = math.ceil(math.log2(n))
    assert cluster.trace.steps() == ({"reduce": steps, "broadcast": steps} if n > 1 else {})
    assert len(cluster.trace) == 2 * (n - 1)  # every rank but the root receives once and sends once


@pytest.mark.parametrize("n", range(1, 10))
def test_recursive_doubling_takes_log2_n_exchange_steps(n):
    cluster = cluster_for("local", n)
    cluster.run(_allreduce, 10, "recursive_doubling")
    p = 1 << (n.bit_length() - 1)  # a non-power of two folds to p first, then unfolds: one step each
    expected = {"exchange": int(math.log2(p))} if p > 1 else {}
    if p != n:
        expected = {"fold": 1, **expected, "unfold": 1}
    assert cluster.trace.steps() == expected
    assert math.ceil(math.log2(n)) == (expected.get("exchange", 0) + (p != n))  # = ⌈log2 N⌉ rounds of partners


@pytest.mark.parametrize("n", [2, 4, 8])
def test_rabenseifner_sends_like_the_ring_in_2_log2_n_steps(n):
    cluster = cluster_for("local", n)
    cluster.run(_allreduce, 840, "rabenseifner")
    assert cluster.trace.steps() == {"reduce_scatter": int(math.log2(n)), "all_gather": int(math.log2(n))}
    assert cluster.trace.bytes_sent() == {r: 2 * (n - 1) * 3360 // n for r in range(n)}


def test_naive_root_sends_n_minus_1_copies():
    cluster = cluster_for("local", 5)
    cluster.run(_allreduce, 100, "naive")
    assert cluster.trace.bytes_sent() == {0: 4 * 400, 1: 400, 2: 400, 3: 400, 4: 400}


def test_trace_prints_one_line_per_message():
    cluster = cluster_for("local", 3)
    cluster.run(_allreduce, 3, "ring")
    lines = cluster.trace.table().splitlines()
    assert len(lines) == 12 and "reduce_scatter  step  0 | rank 0 → 1 | chunk 2" in lines[0], lines
    assert "Trace(12 messages" in repr(cluster.trace)


def test_receives_are_recorded_by_the_receiver():
    cluster = cluster_for("local", 3)
    cluster.run(_allreduce, 3, "ring")
    receives = cluster.trace.receives
    assert len(receives) == len(cluster.trace.events)
    assert all(r.t_start <= r.t_end and r.t_arrived <= r.t_end for r in receives)


def _many_messages(comm, count):
    for _i in range(count):
        ae.allreduce(comm, np.ones(2), algorithm="naive")
    return comm.trace.dropped


def test_a_full_trace_counts_what_it_drops(monkeypatch):
    monkeypatch.setattr(ae.trace.Trace, "MAX_EVENTS", 10)
    cluster = ae.Cluster(2, transport="local")
    try:
        dropped = cluster.run(_many_messages, 20)  # 20 messages sent and 20 received by each rank
    finally:
        cluster.close()
    assert len(cluster.trace.events) == 20 and len(cluster.trace.receives) == 20  # 10 per rank kept
    assert dropped == [20, 20] and cluster.trace.dropped == 40
    assert "40 more not recorded" in repr(cluster.trace)
