"""PowerSGD on 1-8 ranks: one round is a power-iteration step on the mean gradient; a mean of
rank r comes back exactly; warm start converges to the best rank-r approximation; ranks above
min(n, m) are refused; the bytes in the trace are the formula's, step by step; with error
feedback, what was sent plus the residual is the sum of the gradients, every step, every rank."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import cluster_for

from allreduce_edu.exercises import reference
from allreduce_edu.training.compress import PowerSGD, compression_ratio
from allreduce_edu.training.compress.powersgd import draw_normal, orthogonalise
from allreduce_edu.training.compress.train import sent_since

WORLD_SIZES = [1, 2, 3, 4, 5, 7, 8]
SHAPES = [(16, 8), (16,), (3, 16), (4, 5, 6), (2, 2), (16, 8)]  # matrices, a bias, small ones


def grads(rank: int, step: int, shapes, dtype="float64") -> np.ndarray:
    rng = np.random.default_rng([rank, step])
    return np.concatenate([rng.normal(size=s).reshape(-1) for s in shapes]).astype(dtype)


def one_round(comm, shapes, rank=1, dtype="float64", algorithm="ring"):
    scheme = PowerSGD(rank, error_feedback=False, start_powerSGD_iter=0, algorithm=algorithm)
    return scheme.mean(comm, grads(comm.rank, 0, shapes, dtype), shapes)


def power_step(world_size: int, shape, rank: int) -> np.ndarray:
    """One process: P = orth(Σ M Q), Q = Σ Mᵀ P / N, M ≈ P Qᵀ, from the scheme's first Q."""
    ms = [grads(r, 0, [shape]).reshape(shape[0], -1) for r in range(world_size)]
    q = draw_normal(np.random.RandomState(0).randint(1_000_000_000), [(ms[0].shape[1], rank)],
                    "float64")[0]
    p = orthogonalise(sum(m @ orthogonalise(q) for m in ms))
    return (p @ (sum(m.T @ p for m in ms) / world_size).T).reshape(-1)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_one_round_is_a_power_iteration_step_on_the_mean(world_size):
    cluster = cluster_for("local", world_size)
    for rank in (1, 2):
        results = cluster.run(one_round, [(12, 7)], rank)
        for y in results:
            assert y.tobytes() == results[0].tobytes()
        np.testing.assert_allclose(results[0], power_step(world_size, (12, 7), rank), rtol=1e-10,
                                   atol=1e-12)


def low_rank(comm, rank: int, dtype):
    """Every rank's matrix is U Vᵣᵀ with one U: the mean has rank `rank`, and comes back exactly."""
    u = np.random.default_rng(99).normal(size=(20, rank))
    v = np.random.default_rng(comm.rank).normal(size=(30, rank))
    scheme = PowerSGD(rank, error_feedback=False, start_powerSGD_iter=0)
    return scheme.mean(comm, (u @ v.T).reshape(-1).astype(dtype), [(20, 30)]), u, v


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_a_mean_of_rank_r_comes_back_exactly(world_size):
    cluster = cluster_for("local", world_size)
    for rank, dtype, tol in ((1, "float64", 1e-12), (3, "float64", 1e-12), (2, "float32", 1e-5)):
        results = cluster.run(low_rank, rank, dtype)
        u = results[0][1]
        want = sum(u @ v.T for _, _, v in results).reshape(-1) / world_size
        got = results[0][0]
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


def repeated(comm, rounds: int, rank: int):
    """The same matrix every step: warm start makes the rounds a power iteration."""
    m = np.random.default_rng(5).normal(size=(24, 18)) * np.logspace(0, -2, 18)  # decaying
    scheme = PowerSGD(rank, error_feedback=False, start_powerSGD_iter=0)
    return [np.linalg.norm(scheme.mean(comm, m.reshape(-1), [m.shape]) - m.reshape(-1))
            for _ in range(rounds)], m, scheme.q_memory


def test_warm_start_converges_to_the_best_rank_r_approximation():
    cluster = cluster_for("local", 3)
    errors, m, memory = cluster.run(repeated, 40, 2)[0]
    best = np.sqrt(np.sum(np.linalg.svd(m, compute_uv=False)[2:] ** 2))  # Eckart-Young
    assert errors[0] > 1.01 * best and abs(errors[-1] - best) < 1e-6 * best
    assert [q.shape for q in memory[0]] == [(18, 2)]
    def cold(comm):  # each rank's own copy of the scheme: its memory stays empty
        scheme = PowerSGD(2, warm_start=False, start_powerSGD_iter=0, error_feedback=False)
        scheme.mean(comm, m.reshape(-1), [m.shape])
        return scheme.q_memory

    assert cluster.run(cold) == [{}, {}, {}]


def test_vectors_and_small_matrices_go_uncompressed_and_same_shapes_group_as_in_torch():
    squeezed, plain = PowerSGD(1).plan(SHAPES)
    assert squeezed == [0, 5, 2, 3]  # (16, 8) twice first, as torch groups by shape
    assert plain == [1, 4]  # the bias; (2, 2) gains nothing at min_compression_rate 2
    assert compression_ratio(16, 16, 1) == 8 and compression_ratio(1000, 500, 4) == 1000 * 500 / 6000


def test_ranks_above_min_n_m_are_refused_clearly():
    with pytest.raises(ValueError, match=r"rank 4 is more than min\(n, m\) = 3 for a gradient of "
                                         r"shape \(3, 16\).*use rank <= 3"):
        PowerSGD(4).plan([(3, 16)])
    with pytest.raises(ValueError, match="rank 9 is more than min.* = 4 .*shape \\(4, 5, 6\\)"):
        PowerSGD(9).plan([(4, 5, 6)])  # the matrix view is (4, 30)
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="whole number >= 1"):
            PowerSGD(bad)
    cluster = cluster_for("local", 2)
    with pytest.raises(ValueError, match="more than min"):
        cluster.run(one_round, [(3, 16)], 4)
    with pytest.raises(ValueError, match=r"a bucket of 10 values cannot hold tensors of shapes"):
        cluster.run(lambda comm: PowerSGD(1).mean(comm, np.zeros(10), [(3, 4)]))
    with pytest.raises(TypeError, match="floating-point gradients"):
        cluster.run(lambda comm: PowerSGD(1).mean(comm, np.zeros((3, 4), int)))


def test_a_matrix_on_its_own_keeps_its_shape():
    def run(comm):
        m = grads(comm.rank, 0, [(12, 7)]).reshape(12, 7)
        return PowerSGD(1, error_feedback=False, start_powerSGD_iter=0).mean(comm, m)

    got = cluster_for("local", 3).run(run)[0]
    assert got.shape == (12, 7)
    np.testing.assert_allclose(got.reshape(-1), power_step(3, (12, 7), 1), rtol=1e-10, atol=1e-12)


def bytes_by_step(comm, steps: int, rank: int, algorithm="ring"):
    scheme = PowerSGD(rank, start_powerSGD_iter=2, algorithm=algorithm)
    sent = []
    for step in range(steps):
        mark = len(comm.trace.events)
        scheme.mean(comm, grads(comm.rank, step, SHAPES), SHAPES)
        sent.append(sent_since(comm, mark))
    return sent


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_bytes_in_the_trace_are_the_formula_s_every_step(world_size):
    cluster = cluster_for("local", world_size)
    for rank in (1, 2):
        per_rank = cluster.run(bytes_by_step, 4, rank)
        scheme = PowerSGD(rank, start_powerSGD_iter=2)
        for step, sent in enumerate(np.sum(per_rank, axis=0)):
            assert sent == scheme.bytes_per_step(SHAPES, "float64", world_size, step), step
    if world_size > 1:  # compression pays: rank 2's compressed steps send under 2/3 the bytes
        compressed, plain = (scheme.bytes_per_step(SHAPES, "float64", world_size, step)
                             for step in (2, 0))
        assert compressed < 2 / 3 * plain


def audited(comm, steps: int, rank: int):
    scheme = PowerSGD(rank, start_powerSGD_iter=1, audit=True)
    gaps = []
    for step in range(steps):
        scheme.mean(comm, grads(comm.rank, step, SHAPES), SHAPES, key="bucket")
        if step >= 1:  # from the first compressed step on
            gaps.append(scheme.feedback.gap("bucket"))
    return gaps, scheme.feedback.residuals["bucket"]


@pytest.mark.parametrize("world_size", [1, 2, 4, 7])
def test_error_feedback_sent_plus_residual_is_the_sum_of_gradients_every_step(world_size):
    for gaps, residual in cluster_for("local", world_size).run(audited, 8, 1):
        assert max(gaps) < 1e-12 and np.abs(residual).max() > 1e-3  # something was held back


def test_without_error_feedback_there_is_no_residual_and_the_plain_steps_divide_first():
    cluster = cluster_for("local", 3)
    scheme = PowerSGD(1, error_feedback=False, start_powerSGD_iter=5)

    def run(comm):
        x = grads(comm.rank, 0, SHAPES)
        return scheme.mean(comm, x, SHAPES), scheme.feedback.residuals

    for y, residuals in cluster.run(run):
        np.testing.assert_allclose(y, sum(grads(r, 0, SHAPES) for r in range(3)) / 3, rtol=1e-12)
        assert residuals == {}


@pytest.mark.parametrize("algorithm", ["tree", "recursive_doubling", reference("03.1")])
def test_any_algorithm_or_a_learner_s_ring_carries_it(algorithm):
    cluster = cluster_for("local", 4)
    ring = cluster.run(one_round, SHAPES, 2)[0]
    other = cluster.run(one_round, SHAPES, 2, "float64", algorithm)[0]
    np.testing.assert_allclose(other, ring, rtol=1e-9, atol=1e-12)


@pytest.mark.processes
@pytest.mark.parametrize("transport,world_size", [("grpc", 3), ("shm", 2)])
def test_over_real_transports(transport, world_size):
    cluster = cluster_for(transport, world_size)
    results = cluster.run(one_round, [(12, 7)], 1)
    np.testing.assert_allclose(results[-1], power_step(world_size, (12, 7), 1), rtol=1e-10,
                               atol=1e-12)
    assert {e.via for e in cluster.trace} == {transport}
