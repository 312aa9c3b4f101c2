"""The tensor-parallel block with the fused sequence-parallel LayerNorm: its output and every
gradient (the shards put back together, the input's partial sums added) equal one process's torch
autograd on 1–4 ranks, uneven rows included; each collective's bytes are the ring's; SGD on ranks
follows SGD in one process."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import cluster_for  # noqa: E402

from allreduce_edu.training.pytorch.tp_train import (  # noqa: E402
    gather_shards,
    step_in_one_process,
    step_on_rank,
    train_in_one_process,
    train_on_rank,
)

pytestmark = pytest.mark.processes

ROWS, HIDDEN, FFN = 12, 16, 32
TOLERANCE = dict(rtol=1e-10, atol=1e-12)  # float64: the ring and the kernel sum in another order


@pytest.mark.parametrize("world_size,rows", [(1, 12), (2, 12), (3, 10), (4, 12), (4, 5)])
def test_block_matches_one_process_autograd(world_size, rows):
    per_rank = cluster_for("grpc", world_size).run(step_on_rank, rows, HIDDEN, FFN)
    ref, ours = step_in_one_process(rows, HIDDEN, FFN), gather_shards(per_rank)
    for r in per_rank:  # every rank holds the whole output
        np.testing.assert_allclose(r["y"], ref["y"], **TOLERANCE)
    for name, value in ours.items():
        want = ref["x.grad"] if name == "x.grad" else ref["grads"][name]
        np.testing.assert_allclose(value, want, **TOLERANCE, err_msg=name)
    for r in per_rank:  # the norm's gradients are whole, and the same, on every rank
        for name in ("layernorm.weight", "layernorm.bias"):
            np.testing.assert_array_equal(r["grads"][name], per_rank[0]["grads"][name])


@pytest.mark.parametrize("world_size", [2, 4])
def test_each_collective_sends_the_ring_s_bytes(world_size):
    n, s, norm = world_size, ROWS * HIDDEN * 8, 2 * HIDDEN * 8  # bytes: activations, weight+bias
    per_rank = cluster_for("grpc", n).run(step_on_rank, ROWS, HIDDEN, FFN)
    want = {("sequence_parallel_norm/forward", "reduce_scatter"): (n - 1) * s // n,
            ("sequence_parallel_norm/forward", "all_gather"): (n - 1) * s // n,
            ("sequence_parallel_norm/backward", "reduce_scatter"): (n - 1) * s // n,
            ("sequence_parallel_norm/backward", "all_gather"): (n - 1) * s // n,
            ("allreduce/ring", "reduce_scatter"): (n - 1) * norm // n,
            ("allreduce/ring", "all_gather"): (n - 1) * norm // n}
    for r in per_rank:  # 12 rows divide by 2 and 4: every rank sends the same
        assert r["bytes"] == want


def test_sgd_on_ranks_follows_one_process():
    ranks = cluster_for("grpc", 3).run(train_on_rank, 4)
    ref = train_in_one_process(4)
    np.testing.assert_allclose(np.sum([r["loss"] for r in ranks], axis=0), ref["loss"], rtol=1e-10)
    assert ref["loss"][-1] < ref["loss"][0]
    for r in ranks:
        for name in ("layernorm.weight", "layernorm.bias"):
            np.testing.assert_allclose(r[name], ref[name], **TOLERANCE)
