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

# the checker's world: 3 ranks (odd), tensors of 480, 80, 800, 80, 160, 16 bytes (one < world_size
# elements); the scaffold's 700-byte cap makes 3 buckets: [W0 b0], [W1] alone, [b1 W2 b2]
_SIZES, _WORLD, _BATCH, _STEPS, _LR, _CAP = (6, 10, 10, 2), 3, 48, 4, 0.2, 700


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
        return " Every rank must all-reduce every gradient, in the same order."
    if "inhomogeneous" in text or "setting an array element with a sequence" in text:
        return (" allreduce takes one array, and grads is a list of arrays of different shapes: "
                "all-reduce each gradient on its own and return the list of results.")
    if "no attribute 'allreduce'" in text or "no attribute 'all_reduce'" in text:
        return (" The all-reduce is a function of the package, not a method of comm: "
                "allreduce_edu.allreduce(comm, g, op=\"sum\").")
    if "object has no attribute" in text and "Communicator" in text:
        return (" comm has comm.rank and comm.world_size (and send, recv, sendrecv); the number of "
                "ranks is comm.world_size.")
    if "unknown op" in text:
        return (" There is no averaging op: all-reduce with op=\"sum\", then divide by "
                "comm.world_size.")
    if "missing 1 required positional argument" in text and "allreduce" in text:
        return (" allreduce takes the communicator first: "
                "allreduce_edu.allreduce(comm, g, op=\"sum\").")
    return (" Run it yourself to see the traceback: Cluster(3, transport=\"local\")"
            ".run(average_gradients, [np.ones(3), np.ones((2, 2))]).")


@exercise("08.1", kind="code",
          library=("training.data_parallel:bucket_layout", "training.data_parallel:bucket",
             "training.data_parallel:unbucket", "training.data_parallel:allreduce_gradients"),
          function="average_gradients")
def check_average_gradients(fn) -> Feedback:
    """Exercise 08.1: `fn(comm, grads)` returns every gradient averaged over the ranks, one
    all-reduce per bucket of at most 700 bytes; a few SGD steps on 3 gRPC ranks."""
    X, y = make_dataset(n=96, features=_SIZES[0], classes=_SIZES[-1], seed=1)
    params = MLP(_SIZES, seed=1).params
    with Cluster(_WORLD, timeout=5) as cluster:
        results, failure = run_on_ranks(cluster, _train_with, fn, params, X, y, _STEPS, _LR, _BATCH)
        if failure:
            e, text = failure.error, str(failure.error).split("\n")[0][:300].rstrip(".")
            return failed(f"your function raised {type(e).__name__}: {text}"
                          f"{'' if text.endswith('?') else '.'}{_raised_hint(e)}")
        sends = cluster.trace.messages_sent().get(0, 0)
    n, idx = _WORLD, global_batch(0, len(y), _BATCH)
    full = loss_and_grads(params, X[idx], y[idx])[1]  # the full-batch gradient: every rank's goal
    for rank, ((mine, averaged), _) in enumerate(results):
        problem = _step0_problem(rank, mine, averaged, full, n)
        if problem:
            return failed(problem)
    _, reference = train_single(params, X, y, steps=_STEPS, lr=_LR, batch=_BATCH)
    for rank, (_, final) in enumerate(results):
        if final is None or any(not np.allclose(a, b, rtol=1e-9, atol=1e-12)
                                for a, b in zip(final, reference, strict=True)):
            return failed(f"step 0 was right, but after {_STEPS} steps rank {rank}'s weights "
                          f"differ from single-process training: does your function keep state?")
    problem = _bucket_problem(sends, [p.nbytes for p in params], n)
    return problem if problem is not None else passed(
        f"{_STEPS} SGD steps on {n} gRPC ranks end with the same weights as single-process "
        f"training (to 1e-9); rank 0 sent {sends // _STEPS} messages per step: "
        f"{sends // _STEPS // (2 * (n - 1))} buckets × 2(N-1), not {len(params)} tensors × "
        f"2(N-1) = {len(params) * 2 * (n - 1)}.")


def _bucket_problem(sends: int, nbytes: list, n: int) -> Feedback | None:
    """A failure if rank 0 did not make one all-reduce per bucket of the 700-byte cap."""
    made, want = sends / (_STEPS * 2 * (n - 1)), len(bucket_layout(nbytes, _CAP))
    if made == want:
        return None
    why = ("that is one all-reduce per tensor: pack consecutive tensors into buckets of at most "
           "bucket_bytes, one all-reduce each" if made == len(nbytes) else
           "that is one bucket for everything: a new bucket starts when the next tensor would "
           "not fit in bucket_bytes" if made == 1 else
           "some bucket holds more than bucket_bytes: check that the next tensor fits before "
           "adding it, not after" if made < want else
           "more buckets than needed: add tensors while they fit; only a tensor bigger than the "
           "cap goes alone, and no bucket is empty")
    return failed(f"the averages are right, but rank 0 made {made:g} all-reduces per step; the "
                  f"tensors ({', '.join(map(str, nbytes))} bytes) with a 700-byte cap make {want} "
                  f"buckets: {why}.")


def _step0_problem(rank: int, mine, averaged, full, n: int) -> str | None:
    """What is wrong with what `rank` returned at step 0; None if it is the full-batch gradient."""
    if averaged is None:
        return (f"rank {rank}'s function returned None: return the list of averaged gradients "
                f"(if you changed `grads` in place, return grads).")
    if not isinstance(averaged, (list, tuple)):
        return (f"rank {rank} returned a {type(averaged).__name__}; return a list with one "
                f"averaged array per gradient ({len(full)} here).")
    if len(averaged) != len(full):
        return (f"rank {rank} returned {len(averaged)} arrays for {len(full)} gradients: average "
                f"each gradient and return them all, in order.")
    for k, (got, want, own) in enumerate(zip(averaged, full, mine, strict=True)):
        try:
            got = np.asarray(got, float)
        except (TypeError, ValueError):
            return (f"rank {rank}, gradient {k}: you returned a {type(got).__name__}, not an array "
                    f"of numbers.")
        where = f"rank {rank}, gradient {k} (shape {want.shape})"
        if got.shape != want.shape:
            return f"{where}: you returned shape {got.shape}; keep every gradient's shape."
        if np.allclose(got, want, rtol=1e-9, atol=1e-12):
            continue
        if np.allclose(got, own, rtol=1e-9, atol=1e-12):
            return (f"{where} is still this rank's own gradient: the all-reduce's result never "
                    f"reached what you return. allreduce returns a new array (it does not change "
                    f"its input), and `g = ...` inside a for loop does not change the list: build "
                    f"a new list.")
        if np.allclose(got, own / n, rtol=1e-9, atol=1e-12):
            return (f"{where} is this rank's own gradient / world_size: you divided, but threw "
                    f"away the all-reduce's result. allreduce returns a new array; keep it.")
        s = _scale(got, want)
        if abs(s - n) < 1e-6:
            return (f"{where} is {n}× the full-batch gradient: you summed but forgot to divide by "
                    f"comm.world_size.")
        if abs(s - 1 / n) < 1e-6:
            return (f"{where} is 1/{n} of the full-batch gradient: you divided by world_size twice "
                    f"(once before the all-reduce and once after?). Divide once.")
        if np.allclose(got, np.floor(want), atol=1e-9) and not np.allclose(want, np.floor(want)):
            return f"{where} is rounded down to whole numbers: // rounds. Divide with /."
        return (f"{where} differs from the full-batch gradient by up to "
                f"{np.abs(got - want).max():.2e}: all-reduce it with op=\"sum\" and divide by "
                f"comm.world_size.")
    return None


def messages_per_step(tensors: int, world_size: int, bucket_bytes: int | None) -> int:
    """Messages rank 0 sends in one step's gradient all-reduces, counted in a real (local) trace."""
    grads = [np.ones(3) for _ in range(tensors)]  # tiny tensors: one bucket holds them all
    with Cluster(world_size, transport="local") as cluster:
        cluster.run(allreduce_gradients, grads, bucket_bytes)
        return cluster.trace.messages_sent().get(0, 0)


number("08.2", module=__name__,
       blanks=(Blank("my_per_tensor", key="10 * 2 * (8 - 1)"),
               Blank("my_one_bucket", key="2 * (8 - 1)")),
       inputs={"tensors": 10, "world_size": 8}, call="tensors=10, world_size=8", unit="messages",
       exact=True,
       answer=lambda d: {"per_tensor": d.tensors * 2 * (d.world_size - 1),
                      "one_bucket": 2 * (d.world_size - 1)},
       slips=lambda d: _message_slips(d.tensors, d.world_size),
       otherwise=lambda d, name, got: (
        f"count the messages of one ring all-reduce on {d.world_size} ranks (lesson 03), then "
        f"multiply by the {d.tensors} tensors." if name == "per_tensor" else
        f"a bucket is one ring all-reduce on {d.world_size} ranks."),
       success=lambda d: _message_success(d.tensors, d.world_size))


def _message_slips(t: int, n: int) -> list:
    return [
        Slip(t * (n - 1), "that counts one phase only: the ring is N − 1 reduce-scatter steps "
                          "and N − 1 all-gather steps, one message per step each.", "per_tensor"),
        Slip(t * 2 * (n - 1) * n, "that counts every rank's messages; the question asks for rank "
                                  "0's alone.", "per_tensor"),
        Slip(t * 2 * n, "a ring phase has N − 1 steps, not N: a rank never sends to itself.",
             "per_tensor"),
        Slip(t * n, "a ring phase has N − 1 steps, not N: a rank never sends to itself.",
             "per_tensor"),
        Slip(2 * (n - 1), f"that is one all-reduce; one per tensor means {t} all-reduces every "
                          f"step.", "per_tensor"),
        Slip(t * 2 * (n - 1), "one bucket is ONE all-reduce, whatever it holds: it pays the "
                              "2(N − 1) messages once.", "one_bucket"),
        *[Slip(k, "one all-reduce on the ring is still N − 1 reduce-scatter steps and N − 1 "
                  "all-gather steps.", "one_bucket") for k in (1, 2, n - 1)],
    ]


def _message_success(t: int, n: int) -> str:
    counted = (messages_per_step(t, n, None), messages_per_step(t, n, 1 << 20))
    return (f"{t * 2 * (n - 1)} and {2 * (n - 1)}; the trace of a real step on {n} ranks counts "
            f"{counted[0]} and {counted[1]}. Bucketing divides the α cost by {t}.")


choice("08.3", module=__name__)
