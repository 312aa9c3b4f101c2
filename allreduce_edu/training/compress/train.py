"""Lesson 08's model trained data-parallel with a compression scheme: loss curves and bytes.

    runs = compare(cluster, {"plain": Scheme(), "powersgd": PowerSGD(1)}, steps=100)
    runs["powersgd"]["losses"], runs["powersgd"]["bytes_per_step"]

Every rank holds the same MLP (training.py), computes the gradient of its shard of each global
batch, and the scheme averages the gradients, packed into one bucket (as DDP with one big bucket):
`scheme.mean(comm, flat, shapes)`. Each rank gets its own copy of the scheme, so its state (error
buffers, remembered Qs) is that rank's. The bytes of each step are read from the trace.
"""

from __future__ import annotations

import time

import numpy as np

from ...collectives import allreduce
from ..data_parallel import MLP, loss_and_grads, make_dataset, sgd_step, shard, unbucket


def sent_since(comm, mark: int) -> int:
    """Bytes this rank sent since its trace held `mark` events (the trace records its sends)."""
    if comm.trace.dropped:
        raise RuntimeError(f"rank {comm.rank}: the trace is full ({len(comm.trace)} events), so "
                           f"bytes can no longer be counted from it; train for fewer steps")
    return sum(e.nbytes for e in comm.trace.events[mark:])


def train_on_rank(comm, scheme, steps: int = 100, lr: float = 0.1, batch: int = 64,
                  seed: int = 0, sizes=None, samples: int = 512) -> dict:
    """Run on every rank: SGD with gradients averaged by `scheme`; the batch losses, the bytes
    all ranks sent and the slowest rank's seconds averaging each step, the final parameters."""
    X, y = make_dataset(samples, seed=seed)
    params = (MLP(seed=seed) if sizes is None else MLP(sizes, seed=seed)).params
    shapes = [p.shape for p in params]
    losses, sent, seconds = np.zeros(steps), np.zeros(steps), np.zeros(steps)
    for step in range(steps):
        idx = shard(comm, step, len(y), batch, seed)
        weight = len(idx) / batch  # this shard's share of the global batch
        if len(idx):
            loss, grads = loss_and_grads(params, X[idx], y[idx])
        else:  # more ranks than examples: this rank contributes nothing
            loss, grads = 0.0, [np.zeros_like(p) for p in params]
        # (total,) the mean over ranks of N·weight·g is the full batch's gradient
        flat = np.concatenate([(comm.world_size * weight * g).reshape(-1) for g in grads])
        mark, t0 = len(comm.trace.events), time.perf_counter()
        mean = scheme.mean(comm, flat, shapes, key=0, last=True)
        seconds[step] = time.perf_counter() - t0
        sent[step] = sent_since(comm, mark)
        losses[step] = weight * loss
        params = sgd_step(params, unbucket([mean], params), lr)
    # the histories: one all-reduce each, at the end (not counted)
    return {"losses": allreduce(comm, losses, "sum"),
            "bytes_per_step": allreduce(comm, sent, "sum").astype(int),
            "seconds_per_step": allreduce(comm, seconds, "max"),
            "params": params, "scheme": repr(scheme)}


def train(cluster, scheme, steps: int = 100, **kwargs) -> dict:
    """Train on `cluster`'s ranks with `scheme` (train_on_rank's keywords); rank 0's account."""
    return cluster.run(train_on_rank, scheme, steps, **kwargs)[0]


def compare(cluster, schemes: dict, steps: int = 100, **kwargs) -> dict:
    """train() with each of `schemes` (name -> scheme) from the same start; name -> its run."""
    return {name: train(cluster, scheme, steps, **kwargs) for name, scheme in schemes.items()}
