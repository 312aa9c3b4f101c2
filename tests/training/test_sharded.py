"""Sharded data parallel: DP, ZeRO-1, ZeRO-2 and ZeRO-3 train to the same weights; memory and
traffic counted on the ranks match the ZeRO paper's formulas."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import cluster_for

from allreduce_edu.runtime import missing, run_on_engine
from allreduce_edu.training.data_parallel import MLP, loss_and_grads, make_dataset
from allreduce_edu.training.sharded import STAGES, train, zero_formula
from allreduce_edu.training.sharded.layers import loss_and_grads_by_layer
from allreduce_edu.training.sharded.memory import Ledger

X, Y = make_dataset(256, features=8, classes=4)
PARAMS = MLP((8, 16, 16, 4)).params  # every layer's W + b divides by 4: 144, 272, 68 parameters
PSI = sum(p.size for p in PARAMS)


def test_the_layer_by_layer_pass_is_lesson_08s_backprop():
    loss, grads = loss_and_grads(PARAMS, X[:32], Y[:32])
    ready = []
    loss2, grads2 = loss_and_grads_by_layer(lambda i: (PARAMS[2 * i], PARAMS[2 * i + 1]), X[:32], Y[:32],
                                            lambda layer, gW, gb: ready.append(layer), layers=3)
    assert loss2 == loss and all(np.array_equal(a, b) for a, b in zip(grads, grads2))
    assert ready == [2, 1, 0]  # last layer first, as backward produces them


@pytest.fixture(scope="module")
def runs():
    cluster = cluster_for("grpc", 4)
    return {(stage, precision): cluster.run(train, PARAMS, X, Y, stage, 4, 1e-2, 64, 0, precision)
            for stage in STAGES for precision in ("fp32", "mixed")}


@pytest.mark.processes
@pytest.mark.parametrize("precision", ["fp32", "mixed"])
def test_every_stage_ends_with_data_parallels_weights_on_4_grpc_ranks(runs, precision):
    dp = runs["dp", precision][0]["params"]
    for stage in STAGES:
        for rank, result in enumerate(runs[stage, precision]):
            for a, b in zip(dp, result["params"]):
                np.testing.assert_allclose(b, a, rtol=0, atol=1e-6, err_msg=f"{stage} rank {rank}")
    losses = np.sum([r["losses"] for r in runs["dp", precision]], axis=0)
    assert losses[-1] < losses[0]  # it trains


@pytest.mark.processes
@pytest.mark.parametrize("stage, factor", [("dp", 2), ("zero1", 2), ("zero2", 2), ("zero3", 3)])
def test_traffic_per_step_is_2_psi_or_3_psi_to_the_byte(runs, stage, factor):
    for precision, itemsize in (("fp32", 4), ("mixed", 2)):
        for result in runs[stage, precision]:
            for sent in result["traffic"]:
                assert sum(sent.values()) == factor * 3 * PSI * itemsize // 4, (stage, precision, sent)
    collectives = set(runs[stage, "fp32"][0]["traffic"][0])
    assert collectives == ({"allreduce"} if stage == "dp" else {"reduce_scatter", "all_gather"})


@pytest.mark.processes
@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("precision", ["fp32", "mixed"])
def test_memory_held_matches_the_zero_formulas(runs, stage, precision):
    formula = zero_formula(stage, PSI, 4, precision)
    for result in runs[stage, precision]:
        now, peak = result["memory"]["now"], result["memory"]["peak"]
        assert now["params"] == formula["params"] and now["optimizer"] == formula["optimizer"]
        if stage in ("dp", "zero1"):
            assert peak["grads"] >= formula["grads"]  # the full gradient exists
        else:  # shards, plus one layer's full gradient at a time
            full = zero_formula("dp", PSI, 4, precision)["grads"]
            assert formula["grads"] <= peak["grads"] < full


def test_the_paper_example():
    """ZeRO paper, Figure 1: 7.5B parameters, 64 GPUs, mixed precision, K = 12."""
    gb = {s: sum(zero_formula(s, 7.5e9, 64, "mixed").values()) / 1e9 for s in STAGES}
    assert [round(gb[s], 1) for s in STAGES] == [120.0, 31.4, 16.6, 1.9]
    with pytest.raises(ValueError, match="stage must be one of"):
        zero_formula("zero4", 10, 2)


def test_the_ledger_keeps_the_peak():
    ledger = Ledger()
    a, b = np.zeros(10), np.zeros(5)
    ledger.hold("params", a)
    ledger.hold("grads", b)
    ledger.free("grads", b)
    assert ledger.report() == {"now": {"params": 80, "grads": 0, "optimizer": 0},
                               "peak": {"params": 80, "grads": 40, "optimizer": 0}}


def test_the_stages_run_unchanged_on_the_local_transport():
    cluster = cluster_for("local", 4)
    dp, z3 = (cluster.run(train, PARAMS, X, Y, stage, 2)[0]["params"] for stage in ("dp", "zero3"))
    assert all(np.array_equal(a, b) for a, b in zip(dp, z3))


def _zero_on_engine(comm, params, X, y):
    return [train(comm, params, X, y, stage, 2)["params"] for stage in ("dp", "zero1", "zero3")]


@pytest.mark.processes
@pytest.mark.parametrize("engine", ["mpi", "gloo"])
def test_the_stages_run_unchanged_on_mpi_and_gloo(engine):
    if missing(engine):
        pytest.skip(missing(engine))
    for dp, z1, z3 in run_on_engine(_zero_on_engine, engine, 4, PARAMS, X, Y):
        for a, b, c in zip(dp, z1, z3):
            np.testing.assert_allclose(b, a, atol=1e-6)
            np.testing.assert_allclose(c, a, atol=1e-6)
