"""Lesson 11's checkers: a right answer passes, typical wrong ones fail with a specific hint."""

from __future__ import annotations

import numpy as np
import pytest

from allreduce_edu import all_gather, allreduce, reduce_scatter
from allreduce_edu.exercises import reference
from allreduce_edu.exercises.lesson11 import (
    check_zero1_step,
    check_zero2_ranks,
    check_zero3_traffic,
    fewest_ranks,
)
from allreduce_edu.training.sharded import STAGES, zero_formula
from allreduce_edu.training.sharded.adam import adam

# wrong answers run on thread ranks, which start at once (the right answer runs on gRPC)
QUICK = {"transport": "local", "timeout": 5.0}


def _shard(comm, weights):
    size = len(weights) // comm.world_size
    return slice(comm.rank * size, (comm.rank + 1) * size)


def all_reduce_first(comm, weights, grad, m, v, step, lr):  # llm.c's first ZeRO-1
    mine = weights[_shard(comm, weights)].copy()
    adam(mine, allreduce(comm, grad)[_shard(comm, weights)], m, v, step, lr)
    return all_gather(comm, mine)


def all_reduce_twice(comm, weights, grad, m, v, step, lr):  # the shards summed back, not gathered
    mine = weights[_shard(comm, weights)].copy()
    adam(mine, allreduce(comm, grad)[_shard(comm, weights)], m, v, step, lr)
    full = np.zeros_like(weights)
    full[_shard(comm, weights)] = mine
    return allreduce(comm, full)


def own_gradient(comm, weights, grad, m, v, step, lr):  # no reduction at all
    mine = weights[_shard(comm, weights)].copy()
    adam(mine, grad[_shard(comm, weights)], m, v, step, lr)
    return all_gather(comm, mine)


def shard_alone(comm, weights, grad, m, v, step, lr):
    mine = weights[_shard(comm, weights)].copy()
    adam(mine, reduce_scatter(comm, grad), m, v, step, lr)
    return mine


def returns_nothing(comm, weights, grad, m, v, step, lr):
    mine = weights[_shard(comm, weights)].copy()
    adam(mine, reduce_scatter(comm, grad), m, v, step, lr)


def gathers_the_old_shard(comm, weights, grad, m, v, step, lr):
    mine = weights[_shard(comm, weights)].copy()
    adam(mine, reduce_scatter(comm, grad), m, v, step, lr)
    return all_gather(comm, weights[_shard(comm, weights)])


def fresh_moments(comm, weights, grad, m, v, step, lr):
    mine = weights[_shard(comm, weights)].copy()
    adam(mine, reduce_scatter(comm, grad), np.zeros_like(m), np.zeros_like(v), step, lr)
    return all_gather(comm, mine)


def shards_reversed(comm, weights, grad, m, v, step, lr):
    mine = weights[_shard(comm, weights)].copy()
    adam(mine, reduce_scatter(comm, grad), m, v, step, lr)
    return np.concatenate(np.split(all_gather(comm, mine), comm.world_size)[::-1])


def uses_adams_result(comm, weights, grad, m, v, step, lr):  # adam returns None
    mine = adam(weights[_shard(comm, weights)].copy(), reduce_scatter(comm, grad), m, v, step, lr)
    return all_gather(comm, mine)


def step_from_zero(comm, weights, grad, m, v, step, lr):
    mine = weights[_shard(comm, weights)].copy()
    adam(mine, reduce_scatter(comm, grad), m, v, step - 1, lr)
    return all_gather(comm, mine)


def full_adam(comm, weights, grad, m, v, step, lr):  # m and v are shards: shapes clash
    adam(weights, allreduce(comm, grad), m, v, step, lr)
    return weights


def gathers_float64(comm, weights, grad, m, v, step, lr):
    mine = weights[_shard(comm, weights)].astype(np.float64)
    adam(mine, reduce_scatter(comm, grad), m, v, step, lr)
    return all_gather(comm, mine)


def only_rank_0_reduces(comm, weights, grad, m, v, step, lr):
    if comm.rank == 0:
        reduce_scatter(comm, grad)
    return weights


@pytest.mark.processes
def test_right_zero1_step_passes_on_grpc_and_reports_bytes():
    feedback = check_zero1_step(reference("11.1"))
    assert feedback, feedback
    assert "4 gRPC ranks" in feedback.message
    assert "Rank 0 sent 480 bytes per step: reduce-scatter 240 + all-gather 240" in feedback.message


def test_zero1_step_on_an_odd_world_and_a_longer_buffer():
    assert check_zero1_step(reference("11.1"), world_size=3, length=999, steps=4, **QUICK)


@pytest.mark.parametrize("fn, words", [
    (all_reduce_first, ["right weights", "sent 720 bytes in step 1, 1.5× the 480", "llm.c"]),
    (all_reduce_twice, ["sent 960 bytes", "2× the 480"]),
    (own_gradient, ["rank 0's shard (elements 0..19) differs after step 1", "own gradient",
                    "reduce-scatter grad first"]),
    (shard_alone, ["returned 20 numbers, its shard alone"]),
    (returns_nothing, ["returned None at step 1"]),
    (gathers_the_old_shard, ["from before the step"]),
    (fresh_moments, ["differs after step 2", "m and v started from zero again"]),
    (shards_reversed, ["holds shard 3's new weights", "rank order"]),
    (uses_adams_result, ["returns None"]),
    (step_from_zero, ["NaN", "counts from 1"]),
    (full_adam, ["broadcast", "m and v hold this rank's shard only"]),
    (gathers_float64, ["float64", "keep them float32"]),
])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # step_from_zero divides by zero, on purpose
def test_wrong_zero1_steps_get_specific_hints(fn, words):
    feedback = check_zero1_step(fn, **QUICK)
    assert not feedback and feedback.status == "failed", feedback
    for word in words:
        assert word in feedback.message, feedback


def test_a_step_that_hangs_is_reported_not_raised():
    feedback = check_zero1_step(only_rank_0_reduces, transport="local", timeout=1.0)
    assert not feedback and "CollectiveTimeout" in feedback.message
    assert "same collectives in the same order" in feedback.message


def test_the_scaffold_is_not_attempted():
    def my_zero1_step(comm, weights, grad, m, v, step, lr):
        """The scaffold, as lesson 11 ships it."""
        ...

    feedback = check_zero1_step(my_zero1_step)
    assert not feedback and not feedback.attempted and 'hint("11.1")' in feedback.message


PSI, N, K = 1.5e9, 8, 12


@pytest.mark.parametrize("answer, words", [
    (6, "one more rank"), (105 / 17, "round up"), (45, "ZeRO-1's count"), (4, "as ZeRO-3 does"),
    (5, "K = 8"), (60, "4-byte parameters"), (8, "not the fewest"), (3, "50 GB, more than the budget"),
    (6.5, "whole number"), ("lots", "a number of ranks"), (0, "at least one rank"),
])
def test_zero2_ranks_checker(answer, words):
    assert check_zero2_ranks(7, 7.5e9, 32e9) and check_zero2_ranks(7.0)
    feedback = check_zero2_ranks(answer)
    assert not feedback and words in feedback.message, feedback
    assert check_zero2_ranks(None).status == "not attempted"


def test_fewest_ranks_is_the_smallest_that_fits():
    for psi, budget in ((7.5e9, 32e9), (1.5e9, 4e9), (7.5e9, 16e9)):
        n = fewest_ranks("zero2", psi, budget)
        held = [sum(zero_formula("zero2", psi, k, "mixed").values()) for k in (n, n - 1)]
        assert held[0] <= budget < held[1]
        assert check_zero2_ranks(n, psi, budget)
    assert fewest_ranks("dp", 7.5e9, 32e9) is None  # data parallel shards nothing


ONE = (N - 1) / N * PSI * 2  # one ring collective over the fp16 model


@pytest.mark.parametrize("answer, words", [
    (2 * ONE, "backward all-gathers them again"),
    (4 * ONE, "one collective too many"),
    (3 * PSI * 2, "(N − 1)/N of the buffer"),
    (3 * ONE / 2, "counts elements"),
    (ONE, "one collective's bytes"),
    (6 * ONE, "fp16"),
    (3 * ONE / 1e9, "GB"),
    (1.0, "off by"),
])
def test_zero3_traffic_checker(answer, words):
    assert check_zero3_traffic(3 * (N - 1) / N * PSI * 2, PSI, N, 2)
    feedback = check_zero3_traffic(answer, PSI, N, 2)
    assert not feedback and words in feedback.message, feedback
    assert check_zero3_traffic(None, PSI, N, 2).status == "not attempted"


def test_zero_formula_gives_the_papers_numbers():
    """The lesson's first claim: the ZeRO paper's 7.5B-parameter, 64-GPU example, in GB per GPU."""
    paper = {"dp": 120, "zero1": 31.4, "zero2": 16.6, "zero3": 1.9}
    for stage in STAGES:
        total = sum(zero_formula(stage, 7.5e9, 64, "mixed").values()) / 1e9
        assert abs(total - paper[stage]) <= 0.05, (stage, total)


def four_ranks_written_as_a_number(comm, weights, grad, m, v, step, lr):
    """The solution with N written as the 4 the checker's first run uses."""
    n, r = 4, comm.rank
    size = len(weights) // n
    g = reduce_scatter(comm, grad)
    mine = weights[r * size:(r + 1) * size].copy()
    adam(mine, g, m, v, step, lr)
    return all_gather(comm, mine)


def test_a_world_size_written_as_a_number_is_refused():
    """The first run (4 ranks) cannot tell `n = 4` from comm.world_size; the second (3) does."""
    feedback = check_zero1_step(four_ranks_written_as_a_number, **QUICK)
    assert not feedback and feedback.status == "failed", feedback
    assert "right on 4 ranks, but the checker also runs your step on 3 ranks" in feedback.message
    assert "comm.world_size" in feedback.message
