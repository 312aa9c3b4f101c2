"""Exercise 13.1's machinery: lesson 13's CNN trained under DDP with the learner's communication
hook on every rank, each bucket's input and the result of its future written down, and the
diagnosis that names the first bucket, step and rank where the result is not the ranks' mean.

PyTorch is imported only inside the functions, so the course's exercises load without it.
"""

from __future__ import annotations

import time

import numpy as np

from .texts import message

LESSON = "allreduce_edu.exercises.lesson13"  # its messages: lesson13.toml
BATCH = 48  # a batch that 3 ranks (and 2, 4) shard into equal parts


class BucketState:
    """What the learner's hook gets as `state`: this rank's communicator and the ring to run."""

    def __init__(self, comm, ring):
        self.comm, self.ring = comm, ring

    def __repr__(self) -> str:
        return f"BucketState(rank {self.comm.rank} of {self.comm.world_size})"


def train_with_hook(comm, meet: str, hook, ring, steps: int, deadline: float) -> dict:
    """On one rank: the CNN under DDP with `hook(state, bucket)`; every bucket's (step, index,
    input, result), the shard losses and the bytes this rank sent."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from ..training.pytorch.ddp import gloo_group
    from ..training.pytorch.models import make_bars, make_cnn, train

    torch.set_num_threads(1)  # the ranks share this machine's cores
    X, y = make_bars()
    gloo_group(comm, meet)
    model = DistributedDataParallel(make_cnn(), bucket_cap_mb=0.01)
    log: list[dict] = []

    def spy(state, bucket):
        """The learner's hook, its input and its future's result written down."""
        step = sum(1 for e in log if e["index"] == 0) - (bucket.index() != 0)
        entry = {"step": step, "index": bucket.index(),
                 "input": bucket.buffer().detach().numpy().copy(), "output": None}
        log.append(entry)
        future = hook(state, bucket)
        if not isinstance(future, torch.futures.Future):
            raise TypeError(message(LESSON, "13.1", "not-a-future", rank=comm.rank,
                                    name=type(future).__name__,
                                    entry=entry['index']))
        waited = time.monotonic() + deadline
        while not future.done() and time.monotonic() < waited:
            time.sleep(0.001)
        if not future.done():
            raise RuntimeError(message(LESSON, "13.1", "future-not-done", rank=comm.rank,
                                       entry=entry['index'],
                                       deadline=deadline))
        value = future.value()
        if not isinstance(value, torch.Tensor):
            raise TypeError(message(LESSON, "13.1", "not-a-tensor", rank=comm.rank,
                                    name=type(value).__name__))
        entry["output"] = value.detach().numpy().copy()
        return future

    model.register_comm_hook(BucketState(comm, ring), spy)
    run = train(model, X, y, steps, BATCH, 0.1, comm.rank, comm.world_size)
    run["log"] = log
    run["bytes_sent"] = sum(e.nbytes for e in comm.trace.events if e.src == comm.rank)
    return run


def one_process_losses(steps: int) -> np.ndarray:
    """The same CNN, batches and SGD in one process: its loss per step."""
    from ..training.pytorch.models import make_bars, make_cnn, train

    X, y = make_bars()
    return np.array(train(make_cnn(), X, y, steps, BATCH, 0.1)["losses"])


def diagnose(per_rank: list[dict], one: np.ndarray) -> str | None:
    """What is wrong with the hook's results on the ranks (None: nothing)."""
    n = len(per_rank)
    for k, entry in enumerate(per_rank[0]["log"]):
        where = f"bucket {entry['index']} of step {entry['step']}"
        inputs = [r["log"][k]["input"] for r in per_rank]
        outputs = [r["log"][k]["output"] for r in per_rank]
        want = np.mean(inputs, axis=0)
        for r, (mine, out) in enumerate(zip(inputs, outputs, strict=True)):
            if out.shape != want.shape:
                return (message(LESSON, "13.1", "wrong-shape", r=r, where=where, size=want.size,
                                shape=out.shape))
            if np.allclose(out, want, rtol=1e-9, atol=1e-12):
                continue
            if np.allclose(out, n * want, rtol=1e-9, atol=1e-12):
                return (message(LESSON, "13.1", "sum-not-mean", r=r, where=where, n=n))
            if np.allclose(out, mine, rtol=1e-9, atol=1e-12):
                return (message(LESSON, "13.1", "own-gradients", r=r, where=where))
            scale = float(np.vdot(out, want) / np.vdot(want, want)) if np.any(want) else 0.0
            k = n / scale if scale > 0 else 0.0  # the sum divided by k, not by n?
            if round(k) >= 1 and abs(k - round(k)) < 1e-6 and np.allclose(
                    out, n * want / round(k), rtol=1e-9, atol=1e-12):
                return message(LESSON, "13.1", "divided-by", r=r, where=where, k=round(k), n=n)
            return (message(LESSON, "13.1", "not-the-mean", r=r, where=where,
                            max=np.abs(out - want).max()))
    silent = [r for r, run in enumerate(per_rank) if run["bytes_sent"] == 0]
    if silent:
        return (message(LESSON, "13.1", "buckets-came-back", silent=silent[0]))
    # every bucket through the ring: a rank sends about 2(N − 1)/N of each bucket's bytes, so
    # less than half of that means the buckets travelled some other way (a token call aside)
    total = sum(entry["input"].nbytes for entry in per_rank[0]["log"])
    need = total * (n - 1) // n
    short = [r for r, run in enumerate(per_rank) if run["bytes_sent"] < need]
    if short:
        return message(LESSON, "13.1", "buckets-not-through", r=short[0], total=total, need=need,
                       sent=per_rank[short[0]]["bytes_sent"], count=len(per_rank[0]["log"]))
    losses = np.mean([r["losses"] for r in per_rank], axis=0)
    gap = float(np.max(np.abs(losses - one) / np.abs(one)))
    if gap > 1e-9:
        return message(LESSON, "13.1", "every-bucket-right", gap=gap)
    return None
