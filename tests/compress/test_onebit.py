"""1-bit all-reduce on 1-8 ranks: every rank gets the same mean, x's shape and dtype; 2N(N-1)
messages of ⌈len/8⌉ + 4 bytes; the worker and server error buffers keep the invariant every
step; with them, the average of many steps' outputs tends to the true mean."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import cluster_for

from allreduce_edu.training.compress import OneBit, Scheme
from allreduce_edu.training.compress.onebit import padded_size
from allreduce_edu.training.compress.train import sent_since

WORLD_SIZES = [1, 2, 3, 4, 5, 7, 8]


def grad(rank: int, step: int, shape, dtype="float32") -> np.ndarray:
    return np.random.default_rng([rank, step]).normal(size=shape).astype(dtype)


def steps_on_rank(comm, shape, steps: int, dtype="float32", same_grad=False):
    scheme = OneBit(audit=True)
    outputs, sent, gaps = [], [], []
    for step in range(steps):
        mark = len(comm.trace.events)
        outputs.append(scheme.mean(comm, grad(comm.rank, 0 if same_grad else step, shape, dtype),
                                   [shape], key="b"))
        sent.append(sent_since(comm, mark))
        if np.prod(shape):
            gaps.append((scheme.worker.gap("b"), scheme.server.gap("b")))
    return outputs, sent, gaps


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_same_mean_everywhere_and_the_bytes_of_the_formula(world_size):
    cluster = cluster_for("local", world_size)
    for shape in [(0,), (1,), (world_size + 1,), (1009,), (4, 5, 3)]:
        results = cluster.run(steps_on_rank, shape, 2)
        for outputs, _, _ in results:
            for mine, first in zip(outputs, results[0][0], strict=True):
                assert mine.shape == shape and mine.dtype == np.float32
                assert mine.tobytes() == first.tobytes()
        want = OneBit().bytes_per_step([shape], "float32", world_size)
        assert [sum(s) for s in zip(*(sent for _, sent, _ in results))] == [want, want], shape
        chunk = padded_size(int(np.prod(shape)), world_size) // world_size
        assert want == 2 * world_size * (world_size - 1) * (chunk // 8 + 4)


def test_about_a_thirty_second_of_float32_s_ring():
    plain = Scheme().bytes_per_step([(1 << 16,)], "float32", 8)
    assert 28 < plain / OneBit().bytes_per_step([(1 << 16,)], "float32", 8) < 32


@pytest.mark.parametrize("world_size", [1, 2, 5, 8])
def test_worker_and_server_errors_keep_the_invariant_every_step(world_size):
    for _, _, gaps in cluster_for("local", world_size).run(steps_on_rank, (301,), 6):
        assert np.max(gaps) < 1e-5  # float32 sums of O(1) values over 6 steps


def test_error_feedback_makes_the_running_average_unbiased():
    cluster = cluster_for("local", 4)
    outputs = cluster.run(steps_on_rank, (256,), 200, "float64", True)[0][0]
    want = sum(grad(r, 0, (256,), "float64") for r in range(4)) / 4
    one_step = np.linalg.norm(outputs[0] - want) / np.linalg.norm(want)
    averaged = np.linalg.norm(np.mean(outputs, axis=0) - want) / np.linalg.norm(want)
    assert outputs[0].dtype == np.float64
    assert one_step > 0.3 and averaged < 0.1 * one_step


def test_a_constant_chunk_comes_back_exactly():
    cluster = cluster_for("local", 4)
    results = cluster.run(lambda comm: OneBit().mean(comm, np.full(64, 0.5, np.float32)))
    assert all(np.array_equal(y, np.full(64, 0.5, np.float32)) for y in results)


def test_integers_are_refused():
    with pytest.raises(TypeError, match="floating-point gradients"):
        cluster_for("local", 2).run(lambda comm: OneBit().mean(comm, np.arange(8)))


@pytest.mark.processes
@pytest.mark.parametrize("transport,world_size", [("grpc", 3), ("shm", 4)])
def test_over_real_transports(transport, world_size):
    cluster = cluster_for(transport, world_size)
    results = cluster.run(steps_on_rank, (100,), 2)
    assert all(r[0][1].tobytes() == results[0][0][1].tobytes() for r in results)
    assert {e.via for e in cluster.trace} == {transport}
