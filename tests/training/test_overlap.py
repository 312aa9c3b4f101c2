"""DDP-style gradient buckets overlapped with backward: the same training as without overlap, and
the α-β model of the pipeline. (Timings are measured in lesson 12, never asserted here.)"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import cluster_for

from allreduce_edu.model.costmodel import predict
from allreduce_edu.training.data_parallel import MLP, data_parallel_step, make_dataset
from allreduce_edu.training.sharded.overlap import (
    bucket_layers,
    ddp_step,
    measure_overlap,
    predict_exposed,
)

X, Y = make_dataset(256, features=8, classes=4)
PARAMS = MLP((8, 16, 16, 16, 4)).params


def test_buckets_follow_backward_order_and_close_at_the_cap():
    assert bucket_layers([10, 20, 30, 40], None) == [[3], [2], [1], [0]]
    assert bucket_layers([10, 20, 30, 40], 60) == [[3, 2], [1, 0]]
    assert bucket_layers([10, 20, 30, 40], 1000) == [[3, 2, 1, 0]]


def _both(comm, bucket_bytes):
    idx = np.array_split(np.arange(64), comm.world_size)[comm.rank]
    weight = len(idx) / 64
    with_overlap = ddp_step(comm, PARAMS, X[idx], Y[idx], weight, 0.1, bucket_bytes, overlap=True)
    without = ddp_step(comm, PARAMS, X[idx], Y[idx], weight, 0.1, bucket_bytes, overlap=False)
    _, lesson08 = data_parallel_step(comm, PARAMS, X[idx], Y[idx], weight, 0.1)
    return with_overlap, without, lesson08


@pytest.mark.parametrize("bucket_bytes", [None, 3000, 1 << 20])
def test_overlapped_buckets_train_exactly_as_lesson_08(transport, bucket_bytes):
    for with_overlap, without, lesson08 in cluster_for(transport, 4).run(_both, bucket_bytes):
        for a, b, c in zip(with_overlap["params"], without["params"], lesson08):
            np.testing.assert_allclose(a, c, rtol=0, atol=1e-12)
            assert np.array_equal(a, b)
        assert len(with_overlap["comm_spans"]) == len(with_overlap["buckets"])
        assert {kind for kind, *_ in with_overlap["spans"]} == {"forward", "backward"}
        assert with_overlap["exposed"] == pytest.approx(with_overlap["step"] - with_overlap["compute"])


def test_measure_overlap_reports_medians_without_the_params():
    result = cluster_for("local", 4).run(measure_overlap, PARAMS, X, Y, None, True, 3, 64)[0]
    assert "params" not in result and result["exposed_median"] >= 0 and result["step_median"] > 0


def test_the_model_of_the_pipeline():
    alpha, beta, n = 1e-3, 1 / 400e6, 4
    layer_bytes, backward = [1 << 20] * 4, [0.01] * 4
    one = predict("ring", n, 1 << 20, alpha, beta)
    # no overlap: every bucket after backward, one after another
    assert predict_exposed(backward, layer_bytes, None, n, alpha, beta, overlap=False) == pytest.approx(4 * one)
    # overlap: a bucket starts when its layer is done; what is left after backward is exposed
    assert one < 0.01  # each bucket's all-reduce is shorter than one layer's backward, so
    overlapped = predict_exposed(backward, layer_bytes, None, n, alpha, beta)
    assert overlapped == pytest.approx(one)  # ... only the last bucket's is left exposed
    # one big bucket cannot overlap at all
    assert predict_exposed(backward, layer_bytes, 1 << 30, n, alpha, beta) == pytest.approx(
        predict("ring", n, 4 << 20, alpha, beta))
