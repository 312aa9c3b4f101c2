"""The DDP communication hook: lesson 13's CNN trained on 4 gRPC ranks through our all-reduce
follows the same loss curve as DDP with gloo's all_reduce and as one process (same seeds, float64:
within 1e-9 relative), with every bucket's bytes in the trace; every registered algorithm, the
shared-memory transport and a learner-style function work as the hook's all-reduce."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import cluster_for  # noqa: E402

from allreduce_edu.collectives import ALGORITHMS, DESCRIPTIONS  # noqa: E402
from allreduce_edu.exercises import reference  # noqa: E402
from allreduce_edu.training.pytorch.ddp import rendezvous, train_ddp  # noqa: E402
from allreduce_edu.training.pytorch.models import (  # noqa: E402
    accuracy,
    flat_parameters,
    make_bars,
    make_cnn,
    train,
)

pytestmark = pytest.mark.processes

STEPS, TOLERANCE = 30, 1e-9  # relative, on the loss and the parameters (float64)


def one_process(steps: int):
    X, y = make_bars()
    model = make_cnn()
    run = train(model, X, y, steps)
    return np.array(run["losses"]), flat_parameters(model), accuracy(model, X, y)


def batch_loss(per_rank) -> np.ndarray:
    """The ranks' shard losses averaged: the global batch's loss (equal shards)."""
    return np.mean([r["losses"] for r in per_rank], axis=0)


def test_hook_trains_like_gloo_and_like_one_process():
    cluster = cluster_for("grpc", 4)
    losses, params, acc = one_process(STEPS)
    meet = rendezvous()
    folder = Path(meet.removeprefix("file://")).parent
    assert folder.is_dir() and (os.name == "nt" or folder.stat().st_mode & 0o077 == 0)  # private
    ours = cluster.run(train_ddp, meet, "ring", STEPS)
    # rank 0 removed it once all had joined: a killed kernel (nbval stops one so) leaves nothing
    assert not folder.exists()
    hook_trace = cluster.trace
    gloo = cluster.run(train_ddp, rendezvous(), None, STEPS)
    assert acc > 0.9 and losses[-1] < 0.5 * losses[0]  # it really learns
    for run in (ours, gloo):
        np.testing.assert_allclose(batch_loss(run), losses, rtol=TOLERANCE)
        for r in run:  # every rank ends with one process's parameters
            np.testing.assert_allclose(r["params"], params, rtol=TOLERANCE, atol=1e-12)
    # every gradient byte went through our ring: 2(N-1)/N of the model per rank per step
    model_bytes = params.nbytes
    assert hook_trace.bytes_sent() == {r: STEPS * 3 * model_bytes // 2 for r in range(4)}
    assert {e.collective for e in hook_trace} == {"allreduce/ring"}
    # the hook saw every bucket of every step: their bytes add up to the model each step
    buckets = ours[0]["buckets"]
    assert sum(nbytes for _, nbytes in buckets) == STEPS * model_bytes
    assert len({index for index, _ in buckets}) >= 2  # 10 kB buckets: more than one


def test_any_registered_algorithm_is_the_hook_s_all_reduce():
    cluster = cluster_for("grpc", 4)
    losses, params, _ = one_process(3)
    for name in [a for a in ALGORITHMS if DESCRIPTIONS[a].needs != "windows"]:  # gRPC ranks
        run = cluster.run(train_ddp, rendezvous(), name, 3)
        np.testing.assert_allclose(batch_loss(run), losses, rtol=TOLERANCE, err_msg=name)
        np.testing.assert_allclose(run[3]["params"], params, rtol=TOLERANCE, atol=1e-12,
                                   err_msg=name)
        assert {e.collective for e in cluster.trace} == {f"allreduce/{name}"}


def test_a_learner_s_ring_over_shared_memory():
    run = cluster_for("shm", 3).run(train_ddp, rendezvous(), reference("03.1"), 4, batch=63)
    np.testing.assert_allclose(batch_loss(run), one_process_batch(63, 4), rtol=TOLERANCE)
    assert {e.via for e in cluster_for("shm", 3).trace} == {"shm"}


def one_process_batch(batch: int, steps: int) -> np.ndarray:
    X, y = make_bars()
    return np.array(train(make_cnn(), X, y, steps, batch=batch)["losses"])


def test_a_failing_all_reduce_fails_backward_on_every_rank():
    def broken(comm, x):
        raise ValueError("no ring today")

    cluster = cluster_for("grpc", 2)
    # DDP's C++ side reads the failed future as "Unable to cast <the error> to Tensor"
    with pytest.raises(RuntimeError, match="all-reduce of bucket 0 failed: ValueError: no ring"):
        cluster.run(train_ddp, rendezvous(), broken, 1)
    with pytest.raises(ValueError, match="unknown algorithm 'rng'"):
        cluster.run(train_ddp, rendezvous(), "rng", 1)
    # the ranks left their gloo group: they train again
    assert len(cluster.run(train_ddp, rendezvous(), "ring", 1)[0]["losses"]) == 1
