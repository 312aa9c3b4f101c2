"""Lesson 13 · your collectives inside PyTorch: DDP trained through a communication hook, and the
fused LayerNorm forward and backward in a tensor-parallel block; the lesson's helpers and the
checkers of exercise 13.1 (your DDP communication hook, a bucket through your ring: the first
bucket, step and rank whose result is not the ranks' mean) and 13.2 (your gradient sync of the
norm: the parameter and the step where the ranks first disagree).

PyTorch is imported only inside the functions, so the course's exercises load without it.
"""

from __future__ import annotations

import numpy as np

from ..collectives import allreduce
from ..runtime import Cluster
from ..training.pytorch import NEEDS_TORCH, have_torch
from .feedback import Feedback, failed, passed
from .harness import run_on_ranks
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - notebook
from .texts import message

NORM_PARAMETERS = ("layernorm.weight", "layernorm.bias")


def torch_ready() -> bool:
    """True when PyTorch is installed; otherwise prints what this cell needs and returns False."""
    if have_torch():
        return True
    print(f"skipped: this cell {NEEDS_TORCH}")
    return False


# --- the DDP hook ----------------------------------------------------------------------------
def compare_ddp(cluster, algorithm="ring", steps: int = 30) -> dict:
    """Lesson 13's CNN trained three ways, same seeds: one process, DDP over `cluster` with our
    hook (`algorithm`: a name or your fn(comm, x)), DDP with gloo's all_reduce. Each one's loss
    per step (DDP's: the mean of the ranks' shard losses = the batch's), median seconds per step,
    and our run's buckets, bytes per rank and trace."""
    from ..training.pytorch.ddp import rendezvous, train_ddp
    from ..training.pytorch.models import make_bars, make_cnn, train

    X, y = make_bars()
    one = train(make_cnn(), X, y, steps)
    ours = cluster.run(train_ddp, rendezvous(), algorithm, steps)
    trace = cluster.trace  # our run's messages (the gloo run's are gloo's own, not traced)
    gloo = cluster.run(train_ddp, rendezvous(), None, steps)
    runs = {"one process": [one], "our hook": ours, "gloo's all_reduce": gloo}
    return {"losses": {k: np.mean([r["losses"] for r in v], axis=0) for k, v in runs.items()},
            "seconds": {k: float(np.median([np.median(r["seconds"]) for r in v]))
                        for k, v in runs.items()},
            "buckets": ours[0]["buckets"], "bytes_sent": trace.bytes_sent(), "steps": steps,
            "trace": trace}


def print_curves(result: dict, every: int = 5) -> None:
    """The three loss curves side by side, every `every` steps, and the largest relative gap."""
    losses = result["losses"]
    print("step  " + "  ".join(f"{k:>18}" for k in losses))
    for step in range(0, result["steps"], every):
        print(f"{step:>4}  " + "  ".join(f"{v[step]:>18.12f}" for v in losses.values()))
    one = losses["one process"]
    for k in ("our hook", "gloo's all_reduce"):
        gap = np.max(np.abs(losses[k] - one) / np.abs(one))
        print(f"largest relative gap to one process, {k}: {gap:.1e}")


# --- the tensor-parallel block -----------------------------------------------------------------
def check_block(cluster, rows: int = 12, hidden: int = 16, ffn: int = 32) -> dict:
    """The block on `cluster`'s ranks against one process: the largest difference of the output
    and of each gradient, and rank 0's bytes by (collective, phase)."""
    from ..training.pytorch.tp_train import gather_shards, step_in_one_process, step_on_rank

    per_rank = cluster.run(step_on_rank, rows, hidden, ffn)
    ref, ours = step_in_one_process(rows, hidden, ffn), gather_shards(per_rank)
    diffs = {"output": max(float(np.abs(r["y"] - ref["y"]).max()) for r in per_rank)}
    for name, value in ours.items():  # x.grad: the input's, the ranks' partial sums added
        want = ref["x.grad"] if name == "x.grad" else ref["grads"][name]
        diffs[f"grad {name.removesuffix('.grad')}"] = float(np.abs(value - want).max())
    return {"diffs": diffs, "bytes": per_rank[0]["bytes"], "world_size": cluster.world_size,
            "nbytes": rows * hidden * 8, "hidden": hidden}


def print_bytes(result: dict) -> None:
    """Rank 0's bytes per phase of the sequence-parallel norm beside the ring's (N − 1)/N·S
    (the norm's gradient sync is left out: exercise 13.2 asks for it)."""
    n, s = result["world_size"], result["nbytes"]
    print(message(__name__, "13.1", "sizes", n=n, s=s))
    for (collective, phase), sent in result["bytes"].items():
        if collective.startswith("sequence_parallel_norm"):
            print(f"  {collective:<32} {phase:<15} {sent:>6} B   (N−1)/N·{s} = "
                  f"{(n - 1) / n * s:>6.0f} B")


def drift(cluster, sync, steps: int = 6) -> list[tuple[float, float]]:
    """After each SGD step of the block with gradient sync `sync`, how far apart the ranks' norm
    weight and bias are (the largest |rank r − rank 0|)."""
    from ..training.pytorch.tp_train import train_on_rank

    history = cluster.run(train_on_rank, steps, sync=sync)
    return [tuple(max(float(np.abs(h[k][step] - history[0][k][step]).max()) for h in history)
                  for k in NORM_PARAMETERS) for step in range(steps)]


def no_sync(comm, grad_weight, grad_bias):
    """The bug: each rank keeps the gradients of its own rows."""
    return grad_weight, grad_bias


# --- 13.1 ------------------------------------------------------------------------------------


@exercise("13.1", kind="code", function="my_ddp_hook",
          library=("training.pytorch.hook:allreduce_hook",), args=('ring',), gaps=(2, 2))
def check_ddp_hook(my_ddp_hook, ring=None, world_size: int = 3, steps: int = 3,
                   cluster=None, deadline: float = 20.0, also=2) -> Feedback:
    """Exercise 13.1: lesson 13's CNN under DDP on `world_size` gRPC ranks (or `cluster`'s), each
    bucket through your hook and `ring` (the reference ring when None): every bucket's result is
    the ranks' mean, on every rank, sent through the ring, and the loss is one process's. Then one
    step on `also` ranks (a number, or a cluster; None: skip), so that a world size written into
    the hook as a number fails."""
    if not have_torch():
        return Feedback(False, f"this checker {NEEDS_TORCH}", "check failed")
    from .registry import reference

    ring = reference("03.1") if ring is None else ring
    first = _hook_problem(my_ddp_hook, ring, world_size, steps, cluster, deadline)
    if first.problem:
        return failed(first.problem)
    if also is not None:
        other = also if isinstance(also, int) else also.world_size
        second = _hook_problem(my_ddp_hook, ring, other, 1, None if isinstance(also, int)
                               else also, deadline)
        if second.problem:
            return failed(message(__name__, "13.1", "on-another-n", n=first.world_size,
                                  other=other, problem=second.problem))
    return passed(message(__name__, "13.1", "all-buckets-buckets", buckets=first.buckets,
                          steps=steps, count=first.world_size))


def _hook_problem(my_ddp_hook, ring, world_size: int, steps: int, cluster, deadline: float):
    """The hook on `world_size` new gRPC ranks (or `cluster`'s): .problem ("" if none), .buckets
    and .world_size."""
    from types import SimpleNamespace

    from ..training.pytorch.ddp import rendezvous
    from .lesson13_hook import diagnose, one_process_losses, train_with_hook

    args = (rendezvous(), my_ddp_hook, ring, steps, deadline)
    if cluster is None:
        with Cluster(world_size) as ranks:
            per_rank, failure = run_on_ranks(ranks, train_with_hook, *args)
    else:
        per_rank, failure = run_on_ranks(cluster, train_with_hook, *args)
    if failure:  # the learner's hook ran on the ranks: report it
        e, on = failure.error, failure.on
        text = str(e).strip().splitlines()[0].removeprefix(f"{on}: ")
        return SimpleNamespace(problem=message(__name__, "13.1", "my-ddp-hook", on=on,
                                               name=type(e).__name__, text=text))
    wrong = diagnose(per_rank, one_process_losses(steps))
    return SimpleNamespace(problem=f"{wrong} (hint(\"13.1\"))." if wrong else "",
                           buckets=len(per_rank[0]["log"]), world_size=len(per_rank))


# --- 13.2 ------------------------------------------------------------------------------------


@exercise("13.2", kind="code", function="my_sync_norm_grads",
          library=("training.pytorch.tensor_parallel:sync_norm_grads",),
          needs={"allreduce": allreduce},
          before=('from allreduce_edu import all_gather, allreduce, broadcast, reduce, '
                  'reduce_scatter',),
          gaps=(2, 2))
def check_norm_grad_sync(my_sync_norm_grads, world_size: int = 3, steps: int = 4,
                         lr: float = 0.5, cluster=None) -> Feedback:
    """Exercise 13.2: the block trained on `world_size` gRPC ranks (or on `cluster`'s) with your
    sync keeps every rank's norm weights equal, and equal to one process's, step after step."""
    if not have_torch():
        return Feedback(False, f"this checker {NEEDS_TORCH}", "check failed")
    from ..training.pytorch.tensor_parallel import full_parameters
    from ..training.pytorch.tp_train import train_in_one_process, train_on_rank

    if cluster is None:
        with Cluster(world_size) as ranks:
            history, failure = run_on_ranks(ranks, train_on_rank, steps, lr,
                                            sync=my_sync_norm_grads)
    else:
        history, failure = run_on_ranks(cluster, train_on_rank, steps, lr,
                                        sync=my_sync_norm_grads)
        world_size = cluster.world_size
    if failure:  # the learner's code ran on the ranks: report it
        e = failure.error
        return failed(message(__name__, "13.2", "my-sync-norm", name=type(e).__name__,
                              ranks=str(e).splitlines()[0]))
    ref, start = train_in_one_process(steps, lr), full_parameters()
    for step in range(steps):
        for name in NORM_PARAMETERS:
            ranks = [h[name][step] for h in history]
            for r, value in enumerate(ranks[1:], start=1):
                if not np.allclose(value, ranks[0], rtol=1e-9, atol=1e-12):
                    return failed(message(__name__, "13.2", "name-differs-between", name=name, r=r,
                                          step=step + 1,
                                          max=np.abs(value - ranks[0]).max()))
            if not np.allclose(ranks[0], ref[name][step], rtol=1e-9, atol=1e-12):
                ours = ranks[0] - (start[name].detach().numpy() if step == 0
                                   else history[0][name][step - 1])
                want = ref[name][step] - (start[name].detach().numpy() if step == 0
                                          else ref[name][step - 1])
                ratio = float(np.dot(ours, want) / np.dot(want, want))
                why = (f"your step is {ratio:.2f}× the right one: "
                       + (message(__name__, "13.2", "did-average-ranks")
                          if abs(ratio * world_size - 1) < 1e-6
                          else message(__name__, "13.2", "return-sum-over")))
                return failed(message(__name__, "13.2", "name-same-on", name=name, step=step + 1,
                                      why=why))
    return passed(message(__name__, "13.2", "norm-weight-and", world_size=world_size, steps=steps))
