"""Lesson 12's checkers: a right answer passes, typical wrong ones fail with a specific hint; the
lesson's helpers run on real ranks (timings are the lesson's, never asserted here)."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
from conftest import cluster_for

from allreduce_edu import allreduce
from allreduce_edu.exercises import reference
from allreduce_edu.exercises.lesson12 import (
    MLP_LAYER_BYTES,
    NETWORKS,
    busy_cores,
    check_choose_bucket,
    check_no_overlap,
    check_overlap_answer,
    measure,
    plot_overlap,
    zero3_pass,
)
from allreduce_edu.model.costmodel import predict
from allreduce_edu.training.data_parallel import MLP, loss_and_grads, make_dataset
from allreduce_edu.training.sharded.overlap import predict_exposed

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after the backend

ALPHA, BETA, N = 2e-3, 1 / 200e6, 4  # the lesson's emulated link


def exhaustive(layer_bytes, backward_seconds, alpha, beta, world_size):
    sizes = {sum(layer_bytes[i:j]) for i in range(len(layer_bytes))
             for j in range(i + 1, len(layer_bytes) + 1)}
    return min(sizes, key=lambda s: predict_exposed(backward_seconds, layer_bytes, s, world_size,
                                                    alpha, beta))


def powers_of_two(layer_bytes, backward_seconds, alpha, beta, world_size):
    sizes = [1 << k for k in range(10, 40) if 1 << k < 4 * sum(layer_bytes)]
    return min(sizes, key=lambda s: predict_exposed(backward_seconds, layer_bytes, s, world_size,
                                                    alpha, beta))


def best_extreme(layer_bytes, backward_seconds, alpha, beta, world_size):
    return min((min(layer_bytes), sum(layer_bytes)), key=lambda s: predict_exposed(
        backward_seconds, layer_bytes, s, world_size, alpha, beta))


def forgets_to_return(layer_bytes, backward_seconds, alpha, beta, world_size):
    best = sum(layer_bytes)  # noqa: F841 - the mistake under test


def choose_bucket(layer_bytes, backward_seconds, alpha, beta, world_size):
    """The scaffold as the lesson ships it."""
    ...  # your code here, in place of `...`


def test_choose_bucket_checker():
    assert check_choose_bucket(exhaustive) and check_choose_bucket(reference("12.1"))
    assert check_choose_bucket(powers_of_two)  # close enough: within 10% everywhere
    one = check_choose_bucket(lambda lb, *args: sum(lb))
    assert not one and "1 bucket and leave" in one.message and "nothing overlaps" in one.message
    per_layer = check_choose_bucket(lambda lb, *args: 1)
    assert not per_layer and "one bucket per layer pays 2(N − 1)α" in per_layer.message
    extremes = check_choose_bucket(best_extreme)  # the model's best lies in between on the MLP
    assert not extremes and "this lesson's MLP" in extremes.message
    fixed = check_choose_bucket(lambda *args: 1 << 20)  # DDP's first bucket: per layer on 4 MiB
    assert not fixed and "slow-α" in fixed.message and "per layer" in fixed.message
    assert "return a bucket size in bytes" in check_choose_bucket(forgets_to_return).message
    assert "return a bucket size in bytes" in check_choose_bucket(lambda *args: "1 MiB").message
    assert "raised ZeroDivisionError" in check_choose_bucket(lambda *args: 1 / 0).message
    assert check_choose_bucket(choose_bucket).status == "not attempted"


def test_the_networks_need_different_bucket_sizes():
    """Each extreme is wrong somewhere, and the middle is right somewhere: the exercise's point."""
    verdicts = []
    for _, layer_bytes, backward, alpha, beta, n in NETWORKS:
        def model(size, layer_bytes=layer_bytes, backward=backward, alpha=alpha, beta=beta,
                  n=n):
            return predict_exposed(backward, layer_bytes, size, n, alpha, beta)
        best = model(exhaustive(layer_bytes, backward, alpha, beta, n))
        verdicts.append((model(1) > 1.1 * best, model(sum(layer_bytes)) > 1.1 * best))
    assert verdicts == [(True, True), (True, False), (False, True)]


def test_no_overlap_checker():
    want = sum(predict("ring", N, s, ALPHA, BETA) for s in MLP_LAYER_BYTES)
    backward = [0.01] * len(MLP_LAYER_BYTES)  # no overlap: backward's times do not matter
    assert want == pytest.approx(predict_exposed(backward, MLP_LAYER_BYTES, None, N, ALPHA, BETA,
                                                 overlap=False))
    assert check_no_overlap(want) and check_no_overlap(want, MLP_LAYER_BYTES, ALPHA, BETA, N)
    assert want == pytest.approx(0.07296432)
    total = sum(MLP_LAYER_BYTES)
    for answer, text in [(want * 1e3, "milliseconds"), (1.5 * total * BETA, "bytes' time alone"),
                         (predict("ring", N, total, ALPHA, BETA), "one all-reduce of all"),
                         (5 * ALPHA + 1.5 * total * BETA, "2(N − 1) steps"),
                         (30 * ALPHA + total * BETA, "2(N − 1)/N of each bucket"),
                         (3 * want, "off by"), (-1, "positive number"), ("36 ms", "answer with a number")]:
        feedback = check_no_overlap(answer)
        assert not feedback and text in feedback.message, (answer, feedback)
    assert check_no_overlap(None).status == "not attempted"


def test_overlap_answer():
    assert check_overlap_answer("a") and check_overlap_answer(" A ")
    assert "cores to run both" in check_overlap_answer("b").message
    assert "overlap never cuts bytes" in check_overlap_answer("c").message
    assert "not by a link" in check_overlap_answer("d").message
    assert "answer with" in check_overlap_answer("e").message


X, Y = make_dataset(512, features=8, classes=4)
PARAMS = MLP((8, 16, 16, 4)).params


def test_measure_gives_medians_and_the_ranks_of_the_last_round():
    configs = {"no overlap": (None, False), "overlap": (None, True), "one": (1 << 30, True)}
    runs = measure(cluster_for("local", 3), PARAMS, X, Y, configs, rounds=2, steps=2, batch=96)
    assert set(runs) == set(configs)
    for r in runs.values():
        assert r["exposed"] >= 0 and r["step"] > 0 and r["compute"] > 0
        assert len(r["backward"]) == 3 and all(t > 0 for t in r["backward"])
        assert len(r["ranks"]) == 3 and r["buckets"] == r["ranks"][0]["buckets"]
    assert len(runs["overlap"]["buckets"]) == 3 and len(runs["one"]["buckets"]) == 1
    fig, ax = plt.subplots()
    plot_overlap(runs["overlap"]["ranks"], ax, "overlap")
    assert len(ax.collections) == 3 * (2 * 3 + 3)  # per rank: 6 compute spans, 3 buckets
    plt.close(fig)


@pytest.mark.parametrize("world_size", [1, 3, 4])
def test_zero3_pass_gathers_the_right_weights_with_and_without_prefetch(world_size):
    cluster = cluster_for("local", world_size)
    loss = loss_and_grads(PARAMS, X[:64], Y[:64])[0]
    for prefetch in (False, True):
        results = cluster.run(zero3_pass, PARAMS, X[:64], Y[:64], prefetch)
        assert [got for _, got in results] == [loss] * world_size  # the very same arithmetic
        assert all(seconds > 0 for seconds, _ in results)
    # nothing left in flight: a blocking collective right after runs and agrees
    ones = cluster.run(lambda comm: allreduce(comm, np.ones(3)))
    np.testing.assert_array_equal(ones[0], np.full(3, world_size))


@pytest.mark.processes
def test_busy_cores_is_a_share_of_the_machine():
    share = busy_cores(cluster_for("shm", 2), 1 << 16, iters=3)
    assert 0 < share <= 1.2  # CPU seconds of both rank processes over wall seconds × cores
