"""Lesson 00 · welcome: predict an all-reduce, then write one."""

from __future__ import annotations

import numpy as np

from ..runtime import Cluster
from .feedback import Feedback, failed, passed
from .harness import run_on_ranks
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - the notebook's
from .spec import Blank, Slip, number
from .texts import message

number("00.1", module=__name__, blanks=(Blank("my_prediction", key="[60.0, 64.0, 68.0, 72.0]"),),
       inputs={"world_size": 4}, answer=lambda d: _welcome_inputs(d).sum(axis=0).tolist(),
       slips=lambda d: [
        Slip([float(d.world_size)] * 4, "number-ranks-each"),
        Slip((_welcome_inputs(d).sum(axis=0) / d.world_size).tolist(), "average-allreduce-op"),
        Slip([d.world_size * (d.world_size + 1) / 2] * 4, "first-allreduce-above"),
        Slip(_welcome_inputs(d).sum(axis=1).tolist(), "each-rank-own"),
        Slip([_welcome_inputs(d).sum()] * 4, "adds-every-element"),
        *[Slip(x.tolist(), "one-rank-own") for x in _welcome_inputs(d)],
    ],
       otherwise=lambda d, name, got: message(__name__, "00.1", "add-up-np",
                                              element=d.world_size - 1),
       exact=True,
       values=lambda d: {"total": _welcome_inputs(d).sum(axis=0).tolist(),
                         "last": d.world_size - 1})


def _welcome_inputs(d) -> np.ndarray:
    return np.array([np.arange(4.0) + 10 * r for r in range(d.world_size)])


@exercise("00.2", kind="code", function="my_average", library=(), imports="")
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
            return failed(message(__name__, "00.2", "returned-none", rank=rank))
        result = np.asarray(result, dtype=float)
        if result.shape == mean.shape and np.allclose(result, grads[rank]) and world_size > 1:
            return failed(message(__name__, "00.2", "own-gradient", rank=rank,
                                  gradient=grads[rank].tolist()))
        if result.shape == mean.shape and np.allclose(result, total):
            return failed(message(__name__, "00.2", "sum-not-average", rank=rank,
                                  sum=total.tolist()))
        if result.shape != mean.shape or not np.allclose(result, mean):
            return failed(message(__name__, "00.2", "wrong-average", rank=rank,
                                  expected=result.tolist(),
                                  average=mean.tolist(),
                                  world_size=world_size,
                                  listed=', '.join(str(g.tolist()) for g in grads)))
        if not unchanged:
            return failed(message(__name__, "00.2", "changed-grad", rank=rank))
    return passed(message(__name__, "00.2", "all-world-size", world_size=world_size,
                          got=mean.tolist()))


def _gradient(rank: int) -> np.ndarray:
    """Rank `rank`'s gradient in 00.2's check (it differs on every rank)."""
    return np.array([1.0, -2.0, 0.5]) * (rank + 1) ** 2 + rank


def _average_on_rank(comm, fn):
    """The learner's fn(comm, grad) on this rank's gradient: (its result, grad left unchanged?)."""
    grad = _gradient(comm.rank)
    result = fn(comm, grad)
    return result, bool(np.array_equal(grad, _gradient(comm.rank)))
