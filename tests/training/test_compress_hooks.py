"""compress/ against its anchors, torch's own DDP hooks (skipped without torch): our fp16 hook
trains lesson 13's CNN to the very bits of `fp16_compress_hook` (on 2 ranks with our ring, on 4
with gloo's order of additions); our PowerSGD hook follows
`powerSGD_hook` to 1e-9 with torch's random Q, and within LOSS_TOLERANCE with our NumPy one."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import cluster_for  # noqa: E402

from allreduce_edu.training.compress import FP16, PowerSGD  # noqa: E402
from allreduce_edu.training.compress.gloo_order import gloo_ring  # noqa: E402
from allreduce_edu.training.pytorch.anchors import fp16_hook, powersgd_hook, torch_draw  # noqa: E402
from allreduce_edu.training.pytorch.ddp import rendezvous, train_ddp  # noqa: E402

pytestmark = pytest.mark.processes

STEPS = 12
# our Q is drawn by NumPy, torch's by torch.randn: the first compressed step differs, then warm
# start pulls both towards the same subspace; measured here: 0.020 at most (12 steps, rank 1)
LOSS_TOLERANCE = 0.05


def losses(run) -> np.ndarray:
    return np.mean([r["losses"] for r in run], axis=0)


def test_our_fp16_hook_is_torch_s_fp16_compress_hook_bit_for_bit():
    """On 2 ranks an fp16 sum has one order, so every bit must agree: the cast (float64 through
    float32, as torch's), the division first, the fp16 sum and the cast back."""
    cluster = cluster_for("grpc", 2)
    ours = cluster.run(train_ddp, rendezvous(), None, STEPS, compress=FP16())
    assert {e.collective for e in cluster.trace} == {"allreduce/ring"}
    assert len(cluster.trace) and {e.nbytes % 2 for e in cluster.trace} == {0}
    theirs = cluster.run(train_ddp, rendezvous(), None, STEPS, torch_hook=fp16_hook)
    for a, b in zip(ours, theirs, strict=True):
        assert a["losses"] == b["losses"]
        assert a["params"].tobytes() == b["params"].tobytes()


def gloo_beside_ours(comm, meet, size):
    """One fp16 sum three ways on this rank: torch's gloo all_reduce, gloo_ring, our ring."""
    import torch.distributed as dist

    from allreduce_edu.collectives import allreduce
    from allreduce_edu.training.pytorch.ddp import gloo_group

    gloo_group(comm, meet)
    x = np.random.default_rng(comm.rank).standard_normal(size).astype(np.float16)
    theirs = torch.from_numpy(x.copy())
    dist.all_reduce(theirs)
    return theirs.numpy(), gloo_ring(comm, x), allreduce(comm, x, "sum", "ring")


@pytest.mark.parametrize("n", [3, 4, 5])
def test_gloo_ring_adds_in_gloo_s_order_bit_for_bit(n):
    """10 values (short and empty chunks), 1,001, and 3 Mi + 7 (several 1 MiB segments per rank):
    gloo_ring has gloo's bits; our ring, adding in another order, does not (that is the lesson)."""
    cluster = cluster_for("grpc", n)
    for size in (10, 1001, 3 * 2**20 + 7):
        run = cluster.run(gloo_beside_ours, rendezvous(), size)
        for theirs, same_order, _ in run:
            assert same_order.tobytes() == theirs.tobytes(), (n, size)
        theirs, _, ring = run[0]
        if n >= 4 and size > 10:
            assert (ring != theirs).any()  # fp16 addition is not associative


def test_on_4_ranks_our_fp16_hook_in_gloo_s_order_is_torch_s_bit_for_bit():
    """On 4 ranks an fp16 sum depends on its order: our hook summing with gloo_ring trains to
    torch's very bits; with our own ring, to fp16 rounding of the sum order only."""
    cluster = cluster_for("grpc", 4)
    theirs = cluster.run(train_ddp, rendezvous(), None, STEPS, torch_hook=fp16_hook)
    exact = cluster.run(train_ddp, rendezvous(), None, STEPS, compress=FP16(gloo_ring))
    for a, b in zip(exact, theirs, strict=True):
        assert a["losses"] == b["losses"]
        assert a["params"].tobytes() == b["params"].tobytes()
    ours = cluster.run(train_ddp, rendezvous(), None, STEPS, compress=FP16())
    assert ours[0]["losses"][0] == theirs[0]["losses"][0]  # before any compressed step
    assert ours[0]["params"].tobytes() != theirs[0]["params"].tobytes()
    np.testing.assert_allclose(losses(ours), losses(theirs), rtol=1e-4)


def test_our_powersgd_hook_follows_torch_s_powersgd_hook():
    cluster = cluster_for("grpc", 4)
    # one bucket: torch's powerSGD_hook chains its all-reduces in future callbacks, which gloo ran
    # in different orders on different ranks with several buckets here (gloo aborted: "collective
    # mismatch"); ours queues them on the rank's communication thread, in bucket order
    one = {"bucket_cap_mb": 1}
    theirs = cluster.run(train_ddp, rendezvous(), None, STEPS, torch_hook=powersgd_hook, **one)
    same_q = cluster.run(train_ddp, rendezvous(), None, STEPS,
                         compress=PowerSGD(1, start_powerSGD_iter=2, draw=torch_draw), **one)
    np.testing.assert_allclose(losses(same_q), losses(theirs), rtol=1e-9)
    np.testing.assert_allclose(same_q[0]["params"], theirs[0]["params"], rtol=1e-9, atol=1e-12)
    ours = cluster.run(train_ddp, rendezvous(), None, STEPS,
                       compress=PowerSGD(1, start_powerSGD_iter=2), **one)
    gap = np.abs(losses(ours) - losses(theirs))
    print("max |our loss - torch's| with NumPy's Q:", gap.max())
    assert gap.max() < LOSS_TOLERANCE
    assert gap[:3].max() < 1e-12  # two plain steps, then the first compressed step's loss
    # fewer bytes than the plain all-reduce, once PowerSGD runs
    plain = cluster.run(train_ddp, rendezvous(), "ring", STEPS, **one)
    assert ours[0]["bytes_sent"] < 0.5 * plain[0]["bytes_sent"]


def test_powersgd_under_ddp_refuses_to_keep_state_before_the_bucket_rebuild():
    cluster = cluster_for("grpc", 2)
    with pytest.raises(ValueError, match="start_powerSGD_iter >= 2"):
        cluster.run(train_ddp, rendezvous(), None, 1, compress=PowerSGD(1, start_powerSGD_iter=1))


def test_every_scheme_is_a_ddp_hook():
    from allreduce_edu.training.compress import BF16, FP8, OneBit, Scheme

    cluster = cluster_for("shm", 2)
    for scheme in (Scheme("tree"), BF16(), FP8(), OneBit(), PowerSGD(2)):
        run = cluster.run(train_ddp, rendezvous(), None, 4, compress=scheme)
        assert np.isfinite(run[0]["losses"]).all() and run[0]["bytes_sent"] > 0, scheme
        assert run[0]["losses"][-1] < run[0]["losses"][0], scheme
