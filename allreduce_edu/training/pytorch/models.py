"""A generated data set of 8×8 images and a small CNN that learns it: lesson 13's model, trained
in one process here and on ranks by ddp.py. Nothing is downloaded."""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

CLASSES = ("horizontal", "vertical", "diagonal", "anti-diagonal")


def make_bars(n: int = 1024, seed: int = 0):
    """n noisy 8×8 images, each a bar of one of CLASSES at a random offset:
    X (n, 1, 8, 8) float64, y (n,) int64."""
    rng = np.random.default_rng(seed)
    y = rng.integers(len(CLASSES), size=n)
    offset = rng.integers(8, size=n)
    X = rng.normal(scale=0.3, size=(n, 8, 8))  # the noise
    i = np.arange(8)
    for k in range(n):  # draw the bar: a row, a column, or a (wrapped) diagonal
        rows, cols = {0: (offset[k], i), 1: (i, offset[k]), 2: (i, (i + offset[k]) % 8),
                      3: (i, (offset[k] - i) % 8)}[int(y[k])]
        X[k, rows, cols] += 2.0
    return torch.from_numpy(X[:, None]), torch.from_numpy(y)


def make_cnn(seed: int = 0) -> nn.Module:
    """conv 3×3 (8 channels) → ReLU → max-pool → linear 128→32 → tanh → linear 32→4, float64;
    4,340 parameters, the same on every rank for the same seed."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # (batch, 8, 4, 4)
        nn.Flatten(), nn.Linear(128, 32), nn.Tanh(), nn.Linear(32, len(CLASSES)),
    ).double()


def shard_indices(step: int, n: int, batch: int, rank: int = 0, world_size: int = 1,
                  seed: int = 0) -> np.ndarray:
    """The samples of global batch `step` that `rank` computes: a seeded draw of `batch`
    samples, cut into world_size equal shards (so the shards' mean losses average to the
    batch's)."""
    if batch % world_size:
        raise ValueError(f"rank {rank}: batch={batch} must divide by world_size={world_size}, so "
                         f"every shard's mean weighs the same")
    chosen = np.random.default_rng([seed, step]).choice(n, size=batch, replace=False)
    return np.array_split(chosen, world_size)[rank]


def train(model, X, y, steps: int = 20, batch: int = 64, lr: float = 0.1, rank: int = 0,
          world_size: int = 1, seed: int = 0) -> dict:
    """Plain SGD on cross-entropy; one process when world_size is 1, else this rank's shard of
    every batch (the model wrapped in DDP). Each step's loss (of this rank's shard) and
    seconds."""
    optimiser = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses, seconds = [], []
    for step in range(steps):
        idx = torch.from_numpy(shard_indices(step, len(X), batch, rank, world_size, seed))
        t0 = time.perf_counter()
        optimiser.zero_grad()
        loss = F.cross_entropy(model(X[idx]), y[idx])
        loss.backward()  # under DDP: buckets are all-reduced (by the hook) as gradients are ready
        optimiser.step()
        seconds.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return {"losses": losses, "seconds": seconds}


def accuracy(model, X, y) -> float:
    """The share of X that `model` classifies right."""
    with torch.no_grad():
        return float((model(X).argmax(1) == y).double().mean())


def flat_parameters(model) -> np.ndarray:
    """Every parameter, flattened into one float64 array (to compare models)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()
