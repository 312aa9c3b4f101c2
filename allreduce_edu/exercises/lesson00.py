"""Lesson 00 · welcome: predict an all-reduce, then write one."""

from __future__ import annotations

import numpy as np

from ..runtime import Cluster
from .feedback import Feedback, failed, passed
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - the notebook's

MAX_SOLUTION = """def my_max(comm):
    return allreduce_edu.allreduce(comm, np.array([comm.rank, -comm.rank]), op="max")"""


@exercise(
    "00.1", "predict a sum all-reduce", kind="number",
    todo="replace None with what every rank holds afterwards (a list of 4 numbers), then run this "
         "cell again.",
    hints=("Rank r contributes np.full(4, r + 1.0): rank 0 gives four 1.0s, rank 1 four 2.0s, and "
           "so on up to rank 3.",
           "A sum all-reduce adds the ranks' arrays element by element, and every rank gets the "
           "whole result: an array of 4 numbers, each the sum of that element over the 4 ranks."),
    solution="""Rank r contributes np.full(4, r + 1.0), so each element of the sum over ranks
0..N-1 is 1 + 2 + ... + N = N(N+1)/2. For N = 4 every element is 10.0, and every rank gets
the same [10., 10., 10., 10.].""",
    key="""from allreduce_edu.exercises.lesson00 import check_welcome_prediction, hint, solution

my_prediction = [10.0, 10.0, 10.0, 10.0]   # 1 + 2 + 3 + 4 in every element, on every rank
check_welcome_prediction(my_prediction)""")
def check_welcome_prediction(answer, world_size: int = 4) -> Feedback:
    """Exercise 00.1: what does every rank hold after all-reducing np.full(4, rank + 1.0)?"""
    expected = np.full(4, world_size * (world_size + 1) / 2)
    try:
        answer = np.asarray(answer, dtype=float)
    except (TypeError, ValueError):
        return failed("answer with a list of 4 numbers: what every rank holds afterwards.")
    if answer.shape != expected.shape:
        return failed(f"your answer has shape {answer.shape}, but an all-reduce keeps the input's "
                      f"shape {expected.shape}: write a list of 4 numbers.")
    if np.allclose(answer, world_size):
        return failed("that is the number of ranks. Each rank contributes rank + 1, not 1: "
                      "add 1 + 2 + 3 + 4.")
    if np.allclose(answer, expected / world_size):
        return failed("that is the average. allreduce(op='sum') adds; averaging is a division you "
                      "do afterwards.")
    if not np.allclose(answer, expected):
        return failed(f"not quite: add up rank + 1 over ranks 0..{world_size - 1}.")
    return passed(f"every rank holds {expected.tolist()}: 1 + 2 + 3 + 4 = 10 in each element.")


@exercise(
    "00.2", 'all-reduce with op="max"', kind="code", function="my_max", solution=MAX_SOLUTION,
    explanation="Every rank gets [N − 1, 0]: the largest rank, and the largest of −rank "
                "(rank 0's 0).",
    hints=("Build this rank's array first: x = np.array([comm.rank, -comm.rank]).",
           "Call allreduce_edu.allreduce(comm, x, op=...) as first_allreduce above does; "
           'op="max" keeps the largest value of each element instead of adding them up.',
           "Return what the all-reduce gives you: "
           'return allreduce_edu.allreduce(comm, x, op="max").'),
    key="""from allreduce_edu.exercises.lesson00 import check_max_allreduce

""" + MAX_SOLUTION + """

check_max_allreduce(my_max)""")
def check_max_allreduce(fn, world_size: int = 3) -> Feedback:
    """Exercise 00.2: `fn(comm)` must all-reduce [rank, -rank] with op="max" on real gRPC ranks."""
    with Cluster(world_size) as cluster:
        try:
            results = cluster.run(fn)
        except Exception as e:  # noqa: BLE001 - the learner's code: report, don't crash
            return failed(f"your function raised {type(e).__name__}: {e}")
    expected = [world_size - 1, 0]
    total = sum(range(world_size))
    for rank, result in enumerate(results):
        if result is None:
            return failed(f"rank {rank} returned None: return the all-reduce's result.")
        result = np.asarray(result)
        if result.tolist() == [total, -total]:
            return failed(f'rank {rank} got the sum {result.tolist()}: pass op="max".')
        if result.tolist() != expected:
            return failed(f"rank {rank} got {result.tolist()}, expected {expected}: each rank "
                          f"contributes np.array([comm.rank, -comm.rank]).")
    return passed(f"all {world_size} ranks got {expected}: the largest rank, and the largest of "
                  f"-rank (0).")
