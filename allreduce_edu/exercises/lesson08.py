"""Lesson 08 · data-parallel training: bucket and average gradients on real ranks, count bucketed
messages, explain the win."""

from __future__ import annotations

import numpy as np

from ..runtime import Cluster
from ..training.data_parallel import (
    MLP,
    allreduce_gradients,
    bucket_layout,
    global_batch,
    loss_and_grads,
    make_dataset,
    sgd_step,
    shard,
    train_single,
)
from .feedback import Feedback, failed, passed
from .harness import run_on_ranks
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - notebook
from .spec import Blank, Slip, choice, number
from .texts import message

# the checker's worlds: 3 ranks (odd), then 4 (a world size written as a number fails one of
# them); tensors of 480, 80, 800, 80, 160, 16 bytes (one < world_size elements); the scaffold's
# 700-byte cap makes 3 buckets: [W0 b0], [W1] alone, [b1 W2 b2]
_SIZES, _WORLDS, _BATCH, _STEPS, _LR, _CAP = (6, 10, 10, 2), (3, 4), 48, 4, 0.2, 700


def _train_with(comm, fn, params, X, y, steps, lr, batch):
    """Run on every rank: SGD whose gradients the learner's fn(comm, grads) averages; what it
    returned at step 0."""
    first = None
    for step in range(steps):
        idx = shard(comm, step, len(y), batch)
        _, grads = loss_and_grads(params, X[idx], y[idx])
        averaged = fn(comm, [g.copy() for g in grads])
        if step == 0:
            first = (grads, averaged)
        if not isinstance(averaged, (list, tuple)) or len(averaged) != len(params) or any(
                np.shape(a) != p.shape for a, p in zip(averaged, params, strict=True)):
            return first, None  # the checker explains what is wrong with it
        params = sgd_step(params, [np.asarray(a, float) for a in averaged], lr)
    return first, params


def _scale(got: np.ndarray, want: np.ndarray) -> float:
    """The factor s that makes s·want closest to got (least squares)."""
    return float(np.vdot(got, want) / np.vdot(want, want))


def _raised_hint(e: BaseException) -> str:
    """A hint for an exception the learner's function raised on a rank."""
    kind, text = type(e).__name__, str(e)
    if "Timeout" in kind or "Mismatch" in kind:
        return message(__name__, "08.1", "every-rank-must")
    if "inhomogeneous" in text or "setting an array element with a sequence" in text:
        return (message(__name__, "08.1", "allreduce-takes-one"))
    if "no attribute 'allreduce'" in text or "no attribute 'all_reduce'" in text:
        return (message(__name__, "08.1", "all-reduce-function"))
    if "object has no attribute" in text and "Communicator" in text:
        return (message(__name__, "08.1", "comm-has-comm"))
    if "unknown op" in text:
        return (message(__name__, "08.1", "there-no-averaging"))
    if "missing 1 required positional argument" in text and "allreduce" in text:
        return (message(__name__, "08.1", "allreduce-takes-communicator"))
    return (message(__name__, "08.1", "run-yourself-see"))


@exercise("08.1", kind="code",
          library=("training.data_parallel:bucket_layout", "training.data_parallel:bucket",
             "training.data_parallel:unbucket", "training.data_parallel:allreduce_gradients"),
          function="average_gradients")
def check_average_gradients(fn) -> Feedback:
    """Exercise 08.1: `fn(comm, grads)` returns every gradient averaged over the ranks, one
    all-reduce per bucket of at most 700 bytes; a few SGD steps on 3, then 4 gRPC ranks (so a
    world size written into the function as a number fails on one of them)."""
    sends = {}
    for n in _WORLDS:
        problem, sends[n] = _world_problem(fn, n)
        if problem is not None:
            return problem
    n = _WORLDS[0]
    return passed(message(__name__, "08.1", "steps-sgd-steps", STEPS=_STEPS,
                          listed=" and then ".join(map(str, _WORLDS)), n=n,
                          messages=sends[n] // _STEPS,
                          buckets=sends[n] // _STEPS // (2 * (n - 1)), count=len(_params()),
                          unbucketed=len(_params()) * 2 * (n - 1)))


def _params() -> list:
    """The checker's model parameters (the same every run)."""
    return MLP(_SIZES, seed=1).params


def _world_problem(fn, n: int) -> tuple[Feedback | None, int]:
    """(a failure on n gRPC ranks or None, the messages rank 0 sent)."""
    X, y = make_dataset(n=96, features=_SIZES[0], classes=_SIZES[-1], seed=1)
    params = _params()
    with Cluster(n, timeout=5) as cluster:
        results, failure = run_on_ranks(cluster, _train_with, fn, params, X, y, _STEPS, _LR, _BATCH)
        if failure:
            e, text = failure.error, str(failure.error).split("\n")[0][:300].rstrip(".")
            return failed(f"with {n} ranks, your function raised {type(e).__name__}: {text}"
                          f"{'' if text.endswith('?') else '.'}{_raised_hint(e)}"), 0
        sends = cluster.trace.messages_sent().get(0, 0)
    idx = global_batch(0, len(y), _BATCH)
    full = loss_and_grads(params, X[idx], y[idx])[1]  # the full-batch gradient: every rank's goal
    for rank, ((mine, averaged), _) in enumerate(results):
        problem = _step0_problem(rank, mine, averaged, full, n)
        if problem:
            return failed(f"with {n} ranks: {problem}"), sends
    _, reference = train_single(params, X, y, steps=_STEPS, lr=_LR, batch=_BATCH)
    for rank, (_, final) in enumerate(results):
        if final is None or any(not np.allclose(a, b, rtol=1e-9, atol=1e-12)
                                for a, b in zip(final, reference, strict=True)):
            return failed(f"with {n} ranks: " + message(__name__, "08.1", "step-0-was",
                                                         STEPS=_STEPS, rank=rank)), sends
    return _bucket_problem(sends, [p.nbytes for p in params], n), sends


def _bucket_problem(sends: int, nbytes: list, n: int) -> Feedback | None:
    """A failure if rank 0 did not make one all-reduce per bucket of the 700-byte cap."""
    made, want = sends / (_STEPS * 2 * (n - 1)), len(bucket_layout(nbytes, _CAP))
    if made == want:
        return None
    why = (message(__name__, "08.1", "one-all-reduce") if made == len(nbytes) else
           message(__name__, "08.1", "one-bucket-for") if made == 1 else
           message(__name__, "08.1", "some-bucket-holds") if made < want else
           message(__name__, "08.1", "more-buckets-than"))
    return failed(message(__name__, "08.1", "averages-are-right", made=made,
                          listed=', '.join(map(str, nbytes)), want=want, why=why))


def _step0_problem(rank: int, mine, averaged, full, n: int) -> str | None:
    """What is wrong with what `rank` returned at step 0; None if it is the full-batch gradient."""
    if averaged is None:
        return (message(__name__, "08.1", "returned-none", rank=rank))
    if not isinstance(averaged, (list, tuple)):
        return (message(__name__, "08.1", "not-a-list", rank=rank,
                        name=type(averaged).__name__, count=len(full)))
    if len(averaged) != len(full):
        return (message(__name__, "08.1", "wrong-count", rank=rank, count=len(averaged),
                        count2=len(full)))
    for k, (got, want, own) in enumerate(zip(averaged, full, mine, strict=True)):
        try:
            got = np.asarray(got, float)
        except (TypeError, ValueError):
            return (message(__name__, "08.1", "not-an-array", rank=rank, k=k,
                            name=type(got).__name__))
        where = f"rank {rank}, gradient {k} (shape {want.shape})"
        if got.shape != want.shape:
            return message(__name__, "08.1", "where-returned-shape", where=where, shape=got.shape)
        if np.allclose(got, want, rtol=1e-9, atol=1e-12):
            continue
        if np.allclose(got, own, rtol=1e-9, atol=1e-12):
            return (message(__name__, "08.1", "where-still-rank", where=where))
        if np.allclose(got, own / n, rtol=1e-9, atol=1e-12):
            return (message(__name__, "08.1", "where-rank-own", where=where))
        s = _scale(got, want)
        if abs(s - n) < 1e-6:
            return (message(__name__, "08.1", "where-n-full", where=where, n=n))
        if abs(s - 1 / n) < 1e-6:
            return (message(__name__, "08.1", "where-1-n", where=where, n=n))
        k = n / s if s > 0 else 0.0  # the sum divided by k: by a number other than world_size?
        if round(k) != n and round(k) >= 1 and abs(k - round(k)) < 1e-6:
            return message(__name__, "08.1", "where-divided-by", where=where, k=round(k), n=n)
        if np.allclose(got, np.floor(want), atol=1e-9) and not np.allclose(want, np.floor(want)):
            return message(__name__, "08.1", "where-rounded-down", where=where)
        return (message(__name__, "08.1", "where-differs-from", where=where,
                        max=np.abs(got - want).max()))
    return None


def messages_per_step(sizes: tuple, cap: int, world_size: int) -> int:
    """Messages rank 0 sends in one step's bucketed all-reduces, counted in a real (local) trace:
    one float64 gradient of 128·s elements (s KiB) per tensor of s MiB and a cap of `cap` KiB,
    the same buckets at 1/1024 of the bytes."""
    grads = [np.ones(128 * s) for s in sizes]
    with Cluster(world_size, transport="local") as cluster:
        cluster.run(allreduce_gradients, grads, cap << 10)
        return cluster.trace.messages_sent().get(0, 0)


number("08.2", module=__name__,
       setup="sizes, cap = (3, 2, 3, 2, 3, 2, 1, 1, 6, 1), 4   # MiB, in bucketing's order",
       blanks=(Blank("my_on_8_ranks", key="8 * 2 * (8 - 1)"),
               Blank("my_on_16_ranks", key="8 * 2 * (16 - 1)")),
       inputs={"sizes": (3, 2, 3, 2, 3, 2, 1, 1, 6, 1), "cap": 4, "world_sizes": (8, 16)},
       call="sizes, cap", unit="messages", exact=True,
       answer=lambda d: {f"on_{n}_ranks": _buckets(d.sizes, d.cap) * 2 * (n - 1)
                         for n in d.world_sizes},
       slips=lambda d: _message_slips(d.sizes, d.cap, d.world_sizes),
       otherwise=lambda d, name, got: message(__name__, "08.2", "count-messages",
                                              n=int(name.split("_")[1])),
       success=lambda d: _message_success(d.sizes, d.cap, d.world_sizes))


def _buckets(sizes, cap, rule=bucket_layout) -> int:
    return len(rule(list(sizes), cap))


def _closes_past_cap(sizes, cap) -> list:
    """The misread rule: a tensor joins the open bucket, which closes once it reaches the cap."""
    buckets, size = [[]], 0
    for i, s in enumerate(sizes):
        buckets[-1].append(i)
        size += s
        if size >= cap and i < len(sizes) - 1:
            buckets, size = buckets + [[]], 0
    return buckets


def _message_slips(sizes, cap, world_sizes) -> list:
    k = _buckets(sizes, cap)
    slips = []
    for n in world_sizes:
        blank, ring = f"on_{n}_ranks", 2 * (n - 1)
        slips += [
            Slip(k * (n - 1), "counts-one-phase", blank),
            Slip(k * ring * n, "counts-every-rank", blank),
            Slip(k * 2 * n, "ring-phase-has", blank),
            Slip(len(sizes) * ring, "ignores-cap", blank),
            Slip(-(-sum(sizes) // cap) * ring, "full-buckets", blank),
            Slip(_buckets(sizes, cap, _closes_past_cap) * ring, "passes-cap", blank),
            Slip(k, "counts-buckets", blank),
        ]
    slips += [Slip(k * 2 * (min(world_sizes) - 1), "same-buckets-more", f"on_{n}_ranks")
              for n in world_sizes if n != min(world_sizes)]
    return slips


def _message_success(sizes, cap, world_sizes) -> str:
    k = _buckets(sizes, cap)
    n8, n16 = world_sizes
    return message(__name__, "08.2", "success", on_8_ranks=k * 2 * (n8 - 1),
                   on_16_ranks=k * 2 * (n16 - 1), buckets=k,
                   counted=messages_per_step(sizes, cap, n8),
                   counted2=messages_per_step(sizes, cap, n16),
                   per8=len(sizes) * 2 * (n8 - 1), per16=len(sizes) * 2 * (n16 - 1))


choice("08.3", module=__name__)
