"""Lesson 13 · your collectives inside PyTorch: DDP trained through a communication hook, and the
fused LayerNorm forward and backward in a tensor-parallel block; the lesson's helpers and the
checker of exercise 13.1, which trains the block on ranks with your gradient sync and names the
parameter and the step where the ranks first disagree.

PyTorch is imported only inside the functions, so the course's exercises load without it.
"""

from __future__ import annotations

import numpy as np

from ..collectives import allreduce
from ..pytorch import NEEDS_TORCH, have_torch
from ..runtime import Cluster
from .feedback import Feedback, failed, passed
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - notebook

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
    from ..pytorch.ddp import rendezvous, train_ddp
    from ..pytorch.models import make_bars, make_cnn, train

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
    from ..pytorch.tp_train import gather_shards, step_in_one_process, step_on_rank

    per_rank = cluster.run(step_on_rank, rows, hidden, ffn)
    ref, ours = step_in_one_process(rows, hidden, ffn), gather_shards(per_rank)
    diffs = {"output": max(float(np.abs(r["y"] - ref["y"]).max()) for r in per_rank)}
    for name, value in ours.items():  # x.grad: the input's, the ranks' partial sums added
        want = ref["x.grad"] if name == "x.grad" else ref["grads"][name]
        diffs[f"grad {name.removesuffix('.grad')}"] = float(np.abs(value - want).max())
    return {"diffs": diffs, "bytes": per_rank[0]["bytes"], "world_size": cluster.world_size,
            "nbytes": rows * hidden * 8, "hidden": hidden}


def print_bytes(result: dict) -> None:
    """Rank 0's bytes per collective beside the ring's (N − 1)/N·S per phase."""
    n, s, h = result["world_size"], result["nbytes"], result["hidden"]
    formula = {"reduce_scatter": (n - 1) / n, "all_gather": (n - 1) / n}
    print(f"N = {n}, S = {s} bytes of activations, norm weight + bias = {2 * h * 8} bytes")
    for (collective, phase), sent in result["bytes"].items():
        size = 2 * h * 8 if collective.startswith("allreduce") else s
        print(f"  {collective:<32} {phase:<15} {sent:>6} B   (N−1)/N·{size} = "
              f"{formula[phase] * size:>6.0f} B")


def drift(cluster, sync, steps: int = 6) -> list[tuple[float, float]]:
    """After each SGD step of the block with gradient sync `sync`, how far apart the ranks' norm
    weight and bias are (the largest |rank r − rank 0|)."""
    from ..pytorch.tp_train import train_on_rank

    history = cluster.run(train_on_rank, steps, sync=sync)
    return [tuple(max(float(np.abs(h[k][step] - history[0][k][step]).max()) for h in history)
                  for k in NORM_PARAMETERS) for step in range(steps)]


def no_sync(comm, grad_weight, grad_bias):
    """The bug: each rank keeps the gradients of its own rows."""
    return grad_weight, grad_bias


# --- 13.1 ------------------------------------------------------------------------------------
SYNC_SOLUTION = """def my_sync_norm_grads(comm, grad_weight, grad_bias):
    # each rank's gradients come from the rows it normalised: add them up over the ranks
    return allreduce(comm, grad_weight), allreduce(comm, grad_bias)"""


@exercise(
    "13.1", "keep the norm's weights in step", kind="code", function="my_sync_norm_grads",
    solution=SYNC_SOLUTION, needs={"allreduce": allreduce},
    explanation="""Every rank normalises only its own rows, so its gradient of the norm's weight and
bias sums over those rows alone. The batch's gradient is the sum over all rows: one all-reduce
(sum) of each, or of both concatenated (one latency instead of two, as sync_norm_grads does).""",
    hints=("Which rows did this rank's LayerNorm see? Its grad_weight is the sum of dY·x̂ over "
           'those rows only. What does one process sum over?',
           "allreduce(comm, g) sums an array over the ranks; both of the norm's gradients need it.",
           "The key idea: one process sums the norm's gradient over all rows; here each rank holds"
           ' the sum over its own rows, a part of that sum. Add the parts across the ranks — a '
           'sum, not a mean — so every rank applies the same update.'),
    key="""from allreduce_edu import allreduce
from allreduce_edu.exercises.lesson13 import check_norm_grad_sync, hint, solution


""" + SYNC_SOLUTION + """


check_norm_grad_sync(my_sync_norm_grads)""")
def check_norm_grad_sync(my_sync_norm_grads, world_size: int = 3, steps: int = 4,
                         lr: float = 0.5, cluster=None) -> Feedback:
    """Exercise 13.1: the block trained on `world_size` gRPC ranks (or on `cluster`'s) with your
    sync keeps every rank's norm weights equal, and equal to one process's, step after step."""
    if not have_torch():
        return Feedback(False, f"this checker {NEEDS_TORCH}", "check failed")
    from ..pytorch.tensor_parallel import full_parameters
    from ..pytorch.tp_train import train_in_one_process, train_on_rank

    try:
        if cluster is None:
            with Cluster(world_size) as ranks:
                history = ranks.run(train_on_rank, steps, lr, sync=my_sync_norm_grads)
        else:
            history = cluster.run(train_on_rank, steps, lr, sync=my_sync_norm_grads)
            world_size = cluster.world_size
    except Exception as e:  # noqa: BLE001 - the learner's code ran on the ranks: report it
        return failed(f"my_sync_norm_grads raised {type(e).__name__} on the ranks: "
                      f"{str(e).splitlines()[0]}. It gets two float64 arrays of shape (hidden,) "
                      f"and returns two of the same shape.")
    ref, start = train_in_one_process(steps, lr), full_parameters()
    for step in range(steps):
        for name in NORM_PARAMETERS:
            ranks = [h[name][step] for h in history]
            for r, value in enumerate(ranks[1:], start=1):
                if not np.allclose(value, ranks[0], rtol=1e-9, atol=1e-12):
                    return failed(f"{name} differs between rank 0 and rank {r} from step "
                                  f"{step + 1}: max |Δ| = {np.abs(value - ranks[0]).max():.2e}. "
                                  f"Each rank's gradient covers only the rows it normalised, so "
                                  f"each rank takes a different step (hint(\"13.1\")).")
            if not np.allclose(ranks[0], ref[name][step], rtol=1e-9, atol=1e-12):
                ours = ranks[0] - (start[name].detach().numpy() if step == 0
                                   else history[0][name][step - 1])
                want = ref[name][step] - (start[name].detach().numpy() if step == 0
                                          else ref[name][step - 1])
                ratio = float(np.dot(ours, want) / np.dot(want, want))
                why = (f"your step is {ratio:.2f}× the right one: "
                       + ("did you average? The ranks hold parts of a sum (each its own rows); "
                          "add them." if abs(ratio * world_size - 1) < 1e-6
                          else "return the sum over the ranks of each gradient."))
                return failed(f"{name} is the same on every rank but differs from one-process "
                              f"training from step {step + 1}: {why}")
    return passed(f"the norm's weight and bias stay equal on all {world_size} ranks, and equal "
                  f"to one process's, for {steps} steps. Megatron-LM, GPT-NeoX and "
                  f"TransformerEngine each shipped this all-reduce missing at some point: the "
                  f"ranks' copies drift apart silently, and only a check like this one sees it.")
