"""The course's testbed: on emulated links the comparisons the lessons make come out as the α-β
model says, every time. These tests assert an order, never a time."""

from __future__ import annotations

import numpy as np
import pytest

import allreduce_edu as ae
from allreduce_edu import bench
from allreduce_edu.exercises.lesson05 import measured_crossover
from allreduce_edu.model.costmodel import crossover, predict_on_links

pytestmark = pytest.mark.processes

MiB = 1 << 20


def test_the_testbed_is_shared_memory_ranks_on_flat_links():
    with ae.testbed(2) as cluster:
        assert cluster.transport == "shm" and cluster.links == ae.TESTBED
        assert cluster.links.uniform is not None  # one port per rank, one kind of link


def test_ring_beats_naive_large_and_tree_beats_ring_small_five_times_out_of_five():
    runs = []
    with ae.testbed(4) as cluster:
        fitted = bench.fit(cluster)  # the links' α, β plus the transport's own cost per message
        for _ in range(5):
            rows = bench.compare(cluster, ["naive", "ring", "tree"], [8, 4 * MiB], iters=1, warmup=0)
            runs.append({(r["algorithm"], r["bytes"]): r["time_us"] for r in rows})
    model = {k: predict_on_links(k[0], 4, k[1], fitted) for k in runs[0]}
    for t in runs:  # the order, every time
        assert t["ring", 4 * MiB] < t["naive", 4 * MiB] < t["ring", 4 * MiB] * 4, t
        assert t["tree", 8] < t["ring", 8], t
        assert t["ring", 4 * MiB] < t["tree", 4 * MiB], t
    # the ring's advantage over naive at 4 MiB, the median of the 5 runs, within 20 % of the model's
    measured = np.median([t["ring", 4 * MiB] / t["naive", 4 * MiB] for t in runs])
    predicted = model["ring", 4 * MiB] / model["naive", 4 * MiB]
    assert abs(measured / predicted - 1) < 0.2, (measured, predicted)


def test_at_8_ranks_the_ring_s_advantage_over_naive_is_the_fitted_model_s_within_30_percent():
    with ae.testbed(8) as cluster:
        fitted = bench.fit(cluster)  # 8 ranks on 2 cores: the transport's cost per message counts
        ratios = []
        for _ in range(5):
            rows = bench.compare(cluster, ["naive", "ring"], [4 * MiB], iters=1, warmup=0)
            t = {r["algorithm"]: r["time_us"] for r in rows}
            assert t["ring"] < t["naive"] / 2, t  # the order, every time
            ratios.append(t["ring"] / t["naive"])
    predicted = predict_on_links("ring", 8, 4 * MiB, fitted) / predict_on_links(
        "naive", 8, 4 * MiB, fitted)
    # within 30 %: on the portable backend (macOS, Windows) 8 ranks on 2 cores measured 1.23x the
    # model once in .ci/run (the doorbell's cost per message varies more than the fit sees)
    assert abs(np.median(ratios) / predicted - 1) < 0.3, (ratios, predicted)


@pytest.mark.slow
def test_the_measured_tree_ring_crossover_is_within_a_factor_2_of_the_models():
    link = ae.TESTBED.uniform
    predicted = crossover("tree", "ring", 4, link.alpha, link.beta)
    sizes = [int(predicted * f) for f in (1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8)]
    with ae.testbed(4) as cluster:
        rows = bench.compare(cluster, ["tree", "ring"], sizes, iters=3, warmup=1)
    below, first = measured_crossover(rows, "tree", "ring")
    assert predicted / 2 <= first <= 2 * predicted, (below, first, predicted)
