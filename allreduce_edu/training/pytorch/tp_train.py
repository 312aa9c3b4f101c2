"""The tensor-parallel block checked and trained: one step on ranks against one process, and a few
SGD steps that record the norm's weights on every rank. Introduced in lessons/13_pytorch."""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch

from .tensor_parallel import (
    PARAMETERS,
    block,
    full_parameters,
    one_process_norm,
    sequence_parallel_norm,
    shard_parameters,
    sync_norm_grads,
)


def batch(step: int, rows: int, hidden: int, seed: int = 0):
    """Step `step`'s input x and target t, (rows, hidden) float64, the same on every rank."""
    rng = np.random.default_rng([seed, 1, step])
    return torch.from_numpy(rng.normal(size=(rows, hidden))), \
        torch.from_numpy(rng.normal(size=(rows, hidden)))


def loss_of_rows(y, t, rows: slice):
    """Squared error of `rows` over the whole batch's size: the ranks' losses add up to the
    batch's (each rank computes the loss of the rows it normalised)."""
    return ((y[rows] - t[rows]) ** 2).sum() / y.numel()


def bytes_by_collective(comm) -> dict:
    """Bytes this rank sent since the run began, by (collective, phase), from its trace."""
    sent = Counter()
    for e in comm.trace.events:
        if e.src == comm.rank:
            sent[(e.collective, e.tag)] += e.nbytes
    return dict(sent)


def step_on_rank(comm, rows: int = 10, hidden: int = 16, ffn: int = 32, seed: int = 0) -> dict:
    """One forward and backward of rank r's shard of the block: its output, every gradient (of its
    shards; the input's as this rank's partial sum) and its bytes by collective."""
    x, t = batch(0, rows, hidden, seed)
    x.requires_grad_()
    p = shard_parameters(full_parameters(hidden, ffn, seed), comm.rank, comm.world_size)
    y = block(x, p, lambda *a: sequence_parallel_norm(comm, *a))
    mine = np.array_split(np.arange(rows), comm.world_size)[comm.rank]
    loss_of_rows(y, t, slice(mine[0], mine[-1] + 1) if len(mine) else slice(0, 0)).backward()
    grads = {k: v.grad.numpy() for k, v in p.items()}
    return {"y": y.detach().numpy(), "grads": grads, "x.grad": x.grad.numpy(),
            "bytes": bytes_by_collective(comm)}


def step_in_one_process(rows: int = 10, hidden: int = 16, ffn: int = 32, seed: int = 0) -> dict:
    """The same step with torch autograd on the full weights: the reference."""
    x, t = batch(0, rows, hidden, seed)
    x.requires_grad_()
    p = full_parameters(hidden, ffn, seed)
    y = block(x, p, one_process_norm)
    loss_of_rows(y, t, slice(0, rows)).backward()
    return {"y": y.detach().numpy(), "grads": {k: v.grad.numpy() for k, v in p.items()},
            "x.grad": x.grad.numpy()}


def gather_shards(per_rank: list) -> dict:
    """The ranks' gradients put back together as one process's: fc1 by rows, fc2 by columns, the
    norm's from rank 0, the input's summed."""
    grads = [r["grads"] for r in per_rank]
    return {"fc1.weight": np.concatenate([g["fc1.weight"] for g in grads]),
            "fc1.bias": np.concatenate([g["fc1.bias"] for g in grads]),
            "fc2.weight": np.concatenate([g["fc2.weight"] for g in grads], axis=1),
            "layernorm.weight": grads[0]["layernorm.weight"],
            "layernorm.bias": grads[0]["layernorm.bias"],
            "x.grad": sum(r["x.grad"] for r in per_rank)}


def _sgd(p: dict, norm, mine: slice, steps: int, lr: float, rows: int, hidden: int,
         seed: int) -> dict:
    """`steps` of SGD on parameters `p` with this `norm`, the loss over rows `mine`; after every
    step, the norm's weight and bias as this process holds them, and the loss."""
    history = {"layernorm.weight": [], "layernorm.bias": [], "loss": []}
    for step in range(steps):
        x, t = batch(step, rows, hidden, seed)
        loss = loss_of_rows(block(x, p, norm), t, mine)
        for v in p.values():
            v.grad = None
        loss.backward()
        with torch.no_grad():
            for v in p.values():
                v -= lr * v.grad
        for k in ("layernorm.weight", "layernorm.bias"):
            history[k].append(p[k].detach().numpy().copy())
        history["loss"].append(loss.item())
    return history


def train_on_rank(comm, steps: int = 5, lr: float = 0.5, sync=sync_norm_grads, rows: int = 10,
                  hidden: int = 16, ffn: int = 32, seed: int = 0) -> dict:
    """`steps` of SGD on rank r's shard, the norm's gradients summed by `sync`; after every step,
    this rank's copy of the norm's weight and bias, and its loss."""
    p = shard_parameters(full_parameters(hidden, ffn, seed), comm.rank, comm.world_size)
    mine = np.array_split(np.arange(rows), comm.world_size)[comm.rank]
    norm = lambda *a: sequence_parallel_norm(comm, *a, sync=sync)  # noqa: E731
    return _sgd(p, norm, slice(mine[0], mine[-1] + 1), steps, lr, rows, hidden, seed)


def train_in_one_process(steps: int = 5, lr: float = 0.5, rows: int = 10, hidden: int = 16,
                         ffn: int = 32, seed: int = 0) -> dict:
    """The same steps in one process: the norm's weight and bias after each (the reference)."""
    return _sgd(full_parameters(hidden, ffn, seed), one_process_norm, slice(0, rows), steps, lr,
                rows, hidden, seed)


__all__ = ["PARAMETERS", "batch", "step_on_rank", "step_in_one_process", "gather_shards",
           "train_on_rank", "train_in_one_process", "bytes_by_collective"]
