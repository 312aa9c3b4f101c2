"""Lesson 00 · welcome: predict an all-reduce, then write one."""

from __future__ import annotations

import numpy as np

from ..runtime import Cluster
from .feedback import Feedback, failed, passed
from .harness import run_on_ranks
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - the notebook's
from .spec import Blank, Slip, number

MAX_SOLUTION = """def my_max(comm):
    return allreduce_edu.allreduce(comm, np.array([comm.rank, -comm.rank]), op="max")"""


check_welcome_prediction = number(
    "00.1", "predict a sum all-reduce", module=__name__, checker="check_welcome_prediction",
    question="Every rank contributes `np.arange(4.0) + 10 * rank` (rank 1: `[10, 11, 12, 13]`) to "
             "a sum all-reduce on 4 ranks. What does every rank hold afterwards? Write your "
             "answer as a list, then check it.",
    blanks=(Blank("my_prediction", "what every rank holds afterwards: a list of 4 numbers",
                  "[60.0, 64.0, 68.0, 72.0]"),),
    inputs={"world_size": 4}, answer=lambda d: _welcome_inputs(d).sum(axis=0).tolist(),
    slips=lambda d: [
        Slip([float(d.world_size)] * 4, "that is the number of ranks. Each rank contributes its "
             "own array, np.arange(4.0) + 10 * rank, not ones: add those up."),
        Slip((_welcome_inputs(d).sum(axis=0) / d.world_size).tolist(), "that is the average. "
             "allreduce(op='sum') adds; averaging is a division you do afterwards."),
        Slip([d.world_size * (d.world_size + 1) / 2] * 4, "that is what first_allreduce above "
             "gave for np.full(4, rank + 1.0); this exercise's input is different: "
             "np.arange(4.0) + 10 * rank."),
        Slip(_welcome_inputs(d).sum(axis=1).tolist(), "that is each rank's own 4 elements added "
             "up, one number per rank. An all-reduce adds across the ranks, element by element, "
             "and every rank gets the same array."),
        Slip([_welcome_inputs(d).sum()] * 4, "that adds every element of every rank into one "
             "number; an all-reduce keeps the 4 elements apart: element i is the sum of element "
             "i over the ranks."),
        *[Slip(x.tolist(), "that is one rank's own input. After the all-reduce every rank holds "
               "the sum over all the ranks.") for x in _welcome_inputs(d)],
    ],
    otherwise=lambda d, name, got: f"add up np.arange(4.0) + 10 * rank over ranks "
                                   f"0..{d.world_size - 1}, element by element.",
    success=lambda d: f"every rank holds {_welcome_inputs(d).sum(axis=0).tolist()}: element i is "
                      f"i + 10·rank added over ranks 0..{d.world_size - 1}, the same array on "
                      f"every rank.",
    exact=True, todo="replace None with what every rank holds afterwards (a list of 4 numbers), "
                     "then run this cell again.",
    hints=("Rank r contributes np.arange(4.0) + 10 * r: rank 0 gives [0, 1, 2, 3], rank 1 "
           "[10, 11, 12, 13], and so on up to rank 3.",
           "A sum all-reduce adds the ranks' arrays element by element, and every rank gets the "
           "whole result: an array of 4 numbers, element i the sum of element i over the 4 "
           "ranks."),
    solution="""Rank r contributes np.arange(4.0) + 10 * r, so element i of the sum over ranks
0..N-1 is N·i + 10·(0 + 1 + ... + N-1). For N = 4 that is 4i + 60, and every rank gets the
same [60., 64., 68., 72.].""")


def _welcome_inputs(d) -> np.ndarray:
    return np.array([np.arange(4.0) + 10 * r for r in range(d.world_size)])


@exercise(
    "00.2", 'all-reduce with op="max"', kind="code", function="my_max", solution=MAX_SOLUTION,
    library=(),
    explanation="Every rank gets [N − 1, 0]: the largest rank, and the largest of −rank "
                "(rank 0's 0).",
    hints=("Every rank runs the same function, each with its own data: build this rank's "
           "two-element array from its rank, the rank itself and then minus the rank.",
           "You do not write the reduction by hand: the allreduce that first_allreduce above "
           "calls takes an op, and the op decides how the ranks' values combine. Which op keeps "
           "the largest value of each element instead of adding them up?",
           'The key idea: you do not write the reduction, you choose it. Every rank passes its own'
           ' array and the same op, and every rank gets back the element-wise maximum over all '
           'ranks.'),
    key="""from allreduce_edu.exercises.lesson00 import check_max_allreduce

""" + MAX_SOLUTION + """

check_max_allreduce(my_max)""")
def check_max_allreduce(fn, world_size: int = 3) -> Feedback:
    """Exercise 00.2: `fn(comm)` must all-reduce [rank, -rank] with op="max" on real gRPC ranks."""
    with Cluster(world_size) as cluster:
        results, failure = run_on_ranks(cluster, fn)
    if failure:
        return failed(f"your function raised {type(failure.error).__name__}: {failure.error}")
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
