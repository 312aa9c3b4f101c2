"""Lesson 00 · welcome: predict an all-reduce, then write one."""

from __future__ import annotations

import numpy as np

from ..runtime import Cluster
from .feedback import Feedback, failed, passed
from .harness import run_on_ranks
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - the notebook's
from .spec import Blank, Slip, number

AVERAGE_SOLUTION = """def my_average(comm, grad):
    return allreduce_edu.allreduce(comm, grad, op="sum") / comm.world_size"""


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
             "allreduce(op='sum') adds up; it does not divide."),
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
    "00.2", "average a gradient over the ranks", kind="code", function="my_average",
    solution=AVERAGE_SOLUTION, library=(),
    explanation="An all-reduce combines with sum, prod, max or min (NCCL added an average, "
                "ncclAvg, only in 2.10; gloo and MPI have none): the average is the sum, divided "
                "on every rank by the number of ranks. Data-parallel training does this to every "
                "gradient, every step (lesson 08).",
    hints=("Go back to the top of the lesson: before any rank updates its weights, every rank "
           "needs the average of everyone's gradients. Which collective combines one array from "
           "every rank and gives the result back to every rank?",
           "The allreduce you ran in first_allreduce takes an op, one of sum, prod, max and min: "
           "there is no 'mean'. Combine with one of them, then finish the job on each rank with "
           "what every rank knows.",
           "The key idea: an average is a sum divided by how many values went into it. All-reduce "
           "the sum, then every rank divides it by the number of ranks, comm.world_size, and "
           "returns a new array, leaving grad as it was."),
    key="""from allreduce_edu.exercises.lesson00 import check_average

""" + AVERAGE_SOLUTION + """

check_average(my_average)""")
def check_average(fn, world_size: int = 3) -> Feedback:
    """Exercise 00.2: `fn(comm, grad)` must return the average of grad over the ranks, on real
    gRPC ranks, and leave grad unchanged."""
    with Cluster(world_size) as cluster:
        results, failure = run_on_ranks(cluster, _average_on_rank, fn)
    if failure:
        return failed(f"your function raised {type(failure.error).__name__} on {failure.on}: "
                      f"{failure.error}")
    grads = [_gradient(rank) for rank in range(world_size)]
    total, mean = sum(grads), sum(grads) / world_size
    for rank, (result, unchanged) in enumerate(results):
        if result is None:
            return failed(f"rank {rank} returned None: return the average.")
        result = np.asarray(result, dtype=float)
        if result.shape == mean.shape and np.allclose(result, grads[rank]) and world_size > 1:
            return failed(f"rank {rank} returned its own gradient {grads[rank].tolist()}: the "
                          f"ranks must combine theirs first, with a collective.")
        if result.shape == mean.shape and np.allclose(result, total):
            return failed(f"rank {rank} got the sum {total.tolist()}: an all-reduce with "
                          f'op="sum" adds; the average also divides, by the number of ranks.')
        if result.shape != mean.shape or not np.allclose(result, mean):
            return failed(f"rank {rank} got {result.tolist()}, expected the average "
                          f"{mean.tolist()} of the {world_size} ranks' gradients "
                          f"({', '.join(str(g.tolist()) for g in grads)}).")
        if not unchanged:
            return failed(f"rank {rank} returned the right average but changed grad in place: "
                          f"return a new array and leave grad as it was (training still "
                          f"needs it).")
    return passed(f"all {world_size} ranks got {mean.tolist()}, the average of their gradients, "
                  f"with their own grad untouched: one all-reduce and a division per step is "
                  f"data-parallel training's whole communication (lesson 08).")


def _gradient(rank: int) -> np.ndarray:
    """Rank `rank`'s gradient in 00.2's check (it differs on every rank)."""
    return np.array([1.0, -2.0, 0.5]) * (rank + 1) ** 2 + rank


def _average_on_rank(comm, fn):
    """The learner's fn(comm, grad) on this rank's gradient: (its result, grad left unchanged?)."""
    grad = _gradient(comm.rank)
    result = fn(comm, grad)
    return result, bool(np.array_equal(grad, _gradient(comm.rank)))
