"""Data-parallel training (lesson 08): backprop against finite differences; N ranks train exactly like one process."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import cluster_for

from allreduce_edu.training.data_parallel import (
    MLP,
    bucket,
    bucket_layout,
    finite_difference,
    global_batch,
    loss_and_grads,
    make_dataset,
    seconds_per_step,
    train_data_parallel,
    train_single,
    unbucket,
)

X, Y = make_dataset(n=128, features=5, classes=3, seed=3)
SIZES = (5, 7, 6, 3)  # 6 tensors: 35, 7, 42, 6, 18, 3 elements
PARAMS = MLP(SIZES, seed=3).params


def assert_params_close(got, want, tol=1e-12):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def test_dataset_is_deterministic():
    X1, y1 = make_dataset(n=64, seed=7)
    X2, y2 = make_dataset(n=64, seed=7)
    assert X1.shape == (64, 8) and y1.dtype.kind == "i" and set(np.unique(y1)) <= {0, 1, 2}
    assert np.array_equal(X1, X2) and np.array_equal(y1, y2)
    assert not np.array_equal(X1, make_dataset(n=64, seed=8)[0])


def test_mlp_has_one_tensor_per_weight_and_bias():
    model = MLP((8, 16, 16, 3))
    assert [p.shape for p in model.params] == [(8, 16), (16,), (16, 16), (16,), (16, 3), (3,)]
    assert model.nbytes == 8 * (8 * 16 + 16 + 16 * 16 + 16 + 16 * 3 + 3)
    assert "6 parameter tensors" in repr(model)


def test_gradients_match_finite_differences():
    rng = np.random.default_rng(0)
    Xb, yb = X[:20], Y[:20]
    loss, grads = loss_and_grads(PARAMS, Xb, yb)
    assert np.isfinite(loss) and loss > 0
    for k, p in enumerate(PARAMS):
        for _ in range(4):
            index = tuple(rng.integers(s) for s in p.shape)
            assert finite_difference(PARAMS, Xb, yb, k, index) == pytest.approx(grads[k][index], rel=1e-5, abs=1e-8)


def test_average_of_shard_gradients_is_the_full_batch_gradient():
    idx = global_batch(0, len(Y), 60)
    full = loss_and_grads(PARAMS, X[idx], Y[idx])[1]
    shards = np.array_split(idx, 4)  # even: 15 each
    parts = [loss_and_grads(PARAMS, X[s], Y[s])[1] for s in shards]
    assert_params_close([sum(p[k] for p in parts) / 4 for k in range(len(full))], full)


def test_single_process_training_learns():
    losses, params = train_single(PARAMS, X, Y, steps=60, lr=0.3, batch=32)
    assert losses.shape == (60,) and losses[-5:].mean() < 0.7 * losses[:5].mean()
    assert all(p is not q for p, q in zip(params, PARAMS))  # the caller's params are not changed


@pytest.mark.parametrize("bucket_bytes", [0, 1, 100, 200, 400, 10**6])
def test_bucket_round_trip(bucket_bytes):
    grads = loss_and_grads(PARAMS, X[:10], Y[:10])[1]
    buckets = bucket(grads, bucket_bytes)
    assert all(b.ndim == 1 for b in buckets)
    assert sum(b.size for b in buckets) == sum(g.size for g in grads)
    for a, b in zip(unbucket(buckets, grads), grads):
        assert a.shape == b.shape and np.array_equal(a, b)


def test_bucket_layout():
    nbytes = [280, 56, 336, 48, 144, 24]
    assert bucket_layout(nbytes, 0) == [[0], [1], [2], [3], [4], [5]]  # cap 0: one tensor per bucket
    assert bucket_layout(nbytes, 10**6) == [[0, 1, 2, 3, 4, 5]]
    assert bucket_layout(nbytes, 340) == [[0, 1], [2], [3, 4, 5]]  # consecutive, never over the cap ...
    assert bucket_layout([500, 10, 10], 100) == [[0], [1, 2]]  # ... unless one tensor alone is bigger
    assert bucket_layout([], 100) == []


def messages(world_size, tensors_or_buckets, steps):
    """Rank 0's messages: 2(N-1) per ring all-reduce, per step, plus one all-reduce of the loss history."""
    return 2 * (world_size - 1) * (tensors_or_buckets * steps + 1)


@pytest.mark.parametrize("transport, world_size", [("local", 3), pytest.param("grpc", 3, marks=pytest.mark.processes)])
def test_data_parallel_matches_single_process(transport, world_size):
    steps = 30 if transport == "local" else 8
    losses, params = train_single(PARAMS, X, Y, steps=steps, lr=0.3, batch=48)
    cluster = cluster_for(transport, world_size)
    results = cluster.run(train_data_parallel, PARAMS, X, Y, steps=steps, lr=0.3, batch=48)
    assert cluster.trace.messages_sent()[0] == messages(world_size, len(PARAMS), steps)
    for dp_losses, dp_params in results:
        np.testing.assert_allclose(dp_losses, losses, rtol=1e-12)
        assert_params_close(dp_params, params)
    for _, other in results[1:]:  # every replica holds bit-identical weights: they never drift apart
        assert all(np.array_equal(a, b) for a, b in zip(other, results[0][1]))


def test_bucketing_gives_the_same_training_with_fewer_messages():
    cluster = cluster_for("local", 4)
    steps = 10
    per_tensor = cluster.run(train_data_parallel, PARAMS, X, Y, steps=steps, lr=0.3, batch=48)
    sent_per_tensor = cluster.trace.messages_sent()
    nbuckets = len(bucket_layout([p.nbytes for p in PARAMS], 400))
    assert 1 < nbuckets < len(PARAMS)
    for cap, count in ((400, nbuckets), (1 << 20, 1)):
        bucketed = cluster.run(train_data_parallel, PARAMS, X, Y, steps=steps, lr=0.3, batch=48, bucket_bytes=cap)
        assert cluster.trace.messages_sent() == {r: messages(4, count, steps) for r in range(4)}
        assert all(cluster.trace.messages_sent()[r] < sent_per_tensor[r] for r in range(4))
        for (la, pa), (lb, pb) in zip(per_tensor, bucketed):
            np.testing.assert_allclose(lb, la, rtol=1e-12)
            assert_params_close(pb, pa)  # the ring sums each element in an order set by its chunk: equal to rounding


@pytest.mark.parametrize("world_size, batch", [(3, 50), (4, 50), (4, 6), (3, 2)])
def test_uneven_shards_still_match(world_size, batch):
    """50 on 3 ranks: shards 17, 17, 16; 2 examples on 3 ranks: one rank has none."""
    losses, params = train_single(PARAMS, X, Y, steps=12, lr=0.3, batch=batch)
    results = cluster_for("local", world_size).run(train_data_parallel, PARAMS, X, Y, steps=12, lr=0.3, batch=batch,
                                                   bucket_bytes=256)
    for dp_losses, dp_params in results:
        np.testing.assert_allclose(dp_losses, losses, rtol=1e-12)
        assert_params_close(dp_params, params)


def test_plain_average_is_wrong_for_uneven_shards():
    """Why the weights matter: averaging 17-, 17- and 16-example gradients as equals is not the full-batch gradient."""
    idx = global_batch(0, len(Y), 50)
    full = loss_and_grads(PARAMS, X[idx], Y[idx])[1]
    shards = np.array_split(idx, 3)
    parts = [loss_and_grads(PARAMS, X[s], Y[s])[1] for s in shards]
    plain = [sum(p[k] for p in parts) / 3 for k in range(len(full))]
    weighted = [sum(len(s) / 50 * p[k] for s, p in zip(shards, parts)) for k in range(len(full))]
    assert max(np.abs(a - b).max() for a, b in zip(plain, full)) > 1e-6
    assert_params_close(weighted, full)


def test_seconds_per_step_is_a_time():
    seconds = cluster_for("local", 2).run(seconds_per_step, PARAMS, X, Y, steps=2, repeats=2, bucket_bytes=1 << 20)
    assert seconds[0] == seconds[1] > 0
