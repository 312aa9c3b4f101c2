"""Lesson 00 · welcome: predict an all-reduce, then write one."""

from __future__ import annotations

import numpy as np

from ..runtime import Cluster
from .feedback import Feedback, failed, multiple_choice, passed  # noqa: F401
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - for the notebook

SOLUTIONS: dict[str, str] = {}  # TODO(issue 10): move into @exercise registrations

SOLUTIONS["00.1"] = """Rank r contributes np.full(4, r + 1.0); the sum over ranks 0..N-1 is 1 + 2 + ... + N = N(N+1)/2.
For N = 4: every element is 10.0, and every rank gets the same [10., 10., 10., 10.]."""

SOLUTIONS["00.2"] = """def my_max(comm):
    return allreduce_edu.allreduce(comm, np.array([comm.rank, -comm.rank]), op="max")
# every rank gets [N - 1, 0]"""


def check_welcome_prediction(answer, world_size: int = 4) -> Feedback:
    """Exercise 00.1: what does every rank hold after all-reducing np.full(4, rank + 1.0)?"""
    expected = np.full(4, world_size * (world_size + 1) / 2)
    answer = np.asarray(answer, dtype=float)
    if answer.shape != expected.shape:
        return failed(f"your answer has shape {answer.shape}, but an all-reduce keeps the input's shape {expected.shape}.")
    if np.allclose(answer, world_size):
        return failed("that is the number of ranks. Each rank contributes rank + 1, not 1: add 1 + 2 + 3 + 4.")
    if np.allclose(answer, expected / world_size):
        return failed("that is the average. allreduce(op='sum') adds; averaging is a division you do afterwards.")
    if not np.allclose(answer, expected):
        return failed(f"not quite: add up rank + 1 over ranks 0..{world_size - 1}.")
    return passed(f"every rank holds {expected.tolist()}: 1 + 2 + 3 + 4 = 10 in each element.")


def check_max_allreduce(fn, world_size: int = 3) -> Feedback:
    """Exercise 00.2: `fn(comm)` must all-reduce [rank, -rank] with op="max" on real gRPC ranks."""
    with Cluster(world_size) as cluster:
        try:
            results = cluster.run(fn)
        except Exception as e:  # noqa: BLE001 - the learner's code: report, don't crash
            return failed(f"your function raised {type(e).__name__}: {e}")
    expected = [world_size - 1, 0]
    for rank, result in enumerate(results):
        if result is None:
            return failed(f"rank {rank} returned None: return the all-reduce's result.")
        result = np.asarray(result)
        if result.tolist() == [sum(range(world_size)), -sum(range(world_size))]:
            return failed(f"rank {rank} got the sum {result.tolist()}: pass op=\"max\".")
        if result.tolist() != expected:
            return failed(f"rank {rank} got {result.tolist()}, expected {expected}: each rank contributes "
                           f"np.array([comm.rank, -comm.rank]).")
    return passed(f"all {world_size} ranks got {expected}: the largest rank, and the largest of -rank (0).")
