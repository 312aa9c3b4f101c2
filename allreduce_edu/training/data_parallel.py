"""Data-parallel SGD on real ranks: a small NumPy MLP, gradients all-reduced every step, gradient
buckets.

Introduced in lessons/08_data_parallel_training. Every rank holds the same parameters and computes
the gradient of its shard of the global batch; one sum all-reduce of the shard-weighted gradients
gives every rank the full-batch gradient, so every rank takes the same step. Bucketing flattens
many small gradients into few buffers so each all-reduce pays its latency once: Horovod's tensor
fusion (Sergeev & Del Balso, "Horovod: fast and easy distributed deep learning in TensorFlow",
2018) and PyTorch DDP's gradient buckets, `bucket_cap_mb` (Li et al., "PyTorch Distributed:
Experiences on Accelerating Data Parallel Training", 2020).
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from ..collectives import allreduce


def make_dataset(n: int = 512, features: int = 8, classes: int = 3, seed: int = 0):
    """A synthetic classification task: `classes` Gaussian blobs in `features` dimensions
    (X float64, y int64)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=1.5, size=(classes, features))
    y = rng.integers(classes, size=n)
    X = centers[y] + rng.normal(size=(n, features))  # (n, features)
    return X, y


class MLP:
    """A tanh multilayer perceptron with a softmax output; `params` is [W0, b0, W1, b1, ...], one
    array each."""

    def __init__(self, sizes=(8, 16, 16, 16, 16, 16, 16, 16, 3), seed: int = 0):
        rng = np.random.default_rng(seed)
        self.sizes = tuple(sizes)
        self.params = []
        for fan_in, fan_out in itertools.pairwise(self.sizes):
            self.params.append(rng.normal(scale=np.sqrt(1 / fan_in),
                                          size=(fan_in, fan_out)))  # W: (in, out)
            self.params.append(np.zeros(fan_out))  # b: (out,)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.params)

    def __repr__(self) -> str:
        return (f"MLP(sizes={self.sizes}: {len(self.params)} parameter tensors, "
                f"{sum(p.size for p in self.params)} float64 = {self.nbytes} bytes)")


def softmax_cross_entropy(logits: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean softmax cross-entropy of (batch, classes) logits against labels y, and its gradient
    d loss / d logits (batch, classes). Changes `logits` (shifted by their row maximum)."""
    logits -= logits.max(axis=1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    batch = len(y)
    loss = -logp[np.arange(batch), y].mean()
    delta = np.exp(logp)
    delta[np.arange(batch), y] -= 1
    delta /= batch
    return loss, delta


def loss_and_grads(params: list, X: np.ndarray, y: np.ndarray):
    """Mean softmax cross-entropy of the MLP on (X, y), and its gradient for every parameter
    (backprop)."""
    hidden = [X]  # the input of each layer: (batch, in)
    for W, b in zip(params[:-2:2], params[1:-2:2], strict=True):
        hidden.append(np.tanh(hidden[-1] @ W + b))
    loss, delta = softmax_cross_entropy(hidden[-1] @ params[-2] + params[-1], y)
    grads = [None] * len(params)
    for layer in reversed(range(len(params) // 2)):
        grads[2 * layer] = hidden[layer].T @ delta
        grads[2 * layer + 1] = delta.sum(axis=0)
        if layer:
            delta = (delta @ params[2 * layer].T) * (1 - hidden[layer] ** 2)  # back through tanh
    return float(loss), grads


def finite_difference(params: list, X, y, k: int, index, eps: float = 1e-6) -> float:
    """d loss / d params[k][index] by central differences: the check for loss_and_grads'
    backprop."""
    shifted = [p.copy() for p in params]
    shifted[k][index] += eps
    up = loss_and_grads(shifted, X, y)[0]
    shifted[k][index] -= 2 * eps
    return (up - loss_and_grads(shifted, X, y)[0]) / (2 * eps)


def sgd_step(params: list, grads: list, lr: float) -> list:
    """Plain SGD: p - lr·g for every parameter (new arrays; the old ones are not changed)."""
    return [p - lr * g for p, g in zip(params, grads, strict=True)]


def global_batch(step: int, n: int, batch: int, seed: int = 0) -> np.ndarray:
    """The example indices of one step's global batch; every rank computes the same ones from the
    seed."""
    return np.random.default_rng([seed, step]).choice(n, size=batch, replace=False)


def train_single(params: list, X, y, steps: int = 100, lr: float = 0.1, batch: int = 64,
                 seed: int = 0):
    """The reference: SGD in one process on the global batch; returns (losses, final params)."""
    losses = []
    for step in range(steps):
        idx = global_batch(step, len(y), batch, seed)
        loss, grads = loss_and_grads(params, X[idx], y[idx])
        losses.append(loss)
        params = sgd_step(params, grads, lr)
    return np.array(losses), params


def bucket_layout(nbytes: list, bucket_bytes: int) -> list[list[int]]:
    """Which tensors share a bucket: consecutive tensors while they fit in `bucket_bytes` (a bigger
    one goes alone)."""
    buckets, size = [], 0
    for i, n in enumerate(nbytes):
        if not buckets or size + n > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += n
    return buckets


def bucket(grads: list, bucket_bytes: int) -> list[np.ndarray]:
    """Flatten the gradients into 1-D buckets of at most `bucket_bytes` each (unless one tensor is
    bigger)."""
    return [np.concatenate([grads[i].ravel() for i in group])
            for group in bucket_layout([g.nbytes for g in grads], bucket_bytes)]


def unbucket(buckets: list, like: list) -> list[np.ndarray]:
    """Cut buckets back into arrays shaped as `like` (the inverse of `bucket`)."""
    flat = np.concatenate(buckets) if buckets else np.empty(0)
    ends = np.cumsum([g.size for g in like])[:-1]
    return [piece.reshape(g.shape) for piece, g in zip(np.split(flat, ends), like, strict=False)]


def comm_buffers(grads: list, bucket_bytes: int | None) -> list[np.ndarray]:
    """What gets all-reduced: each gradient itself (bucket_bytes=None), or the buckets they are
    packed into."""
    return list(grads) if bucket_bytes is None else bucket(grads, bucket_bytes)


def allreduce_gradients(comm, grads: list, bucket_bytes: int | None = None,
                        algorithm: str = "ring") -> list:
    """Sum every gradient over the ranks: one all-reduce per tensor, or one per bucket of
    `bucket_bytes`."""
    summed = [allreduce(comm, b, op="sum", algorithm=algorithm)
              for b in comm_buffers(grads, bucket_bytes)]
    return summed if bucket_bytes is None else unbucket(summed, grads)


def shard(comm, step: int, n: int, batch: int, seed: int = 0) -> np.ndarray:
    """This rank's examples at `step`: piece `rank` of np.array_split(global batch, world_size)."""
    return np.array_split(global_batch(step, n, batch, seed), comm.world_size)[comm.rank]


def data_parallel_step(comm, params: list, X_shard, y_shard, weight: float, lr: float,
                       bucket_bytes: int | None = None, algorithm: str = "ring"):
    """One SGD step on every rank: sum the shard gradients weighted by len(shard)/batch;
    (weighted loss, params)."""
    # weight = this shard's share of the global batch: 1/world_size for even shards, so the sum
    # all-reduce is the plain average allreduce(g) / world_size; uneven shards need their own
    # weights to give the full-batch gradient
    if len(y_shard):
        loss, grads = loss_and_grads(params, X_shard, y_shard)
    else:  # more ranks than examples: this rank contributes nothing
        loss, grads = 0.0, [np.zeros_like(p) for p in params]
    grads = allreduce_gradients(comm, [weight * g for g in grads], bucket_bytes, algorithm)
    return weight * loss, sgd_step(params, grads, lr)  # every rank takes the same step


def train_data_parallel(comm, params: list, X, y, steps: int = 100, lr: float = 0.1,
                        batch: int = 64, seed: int = 0, bucket_bytes: int | None = None,
                        algorithm: str = "ring"):
    """Run on every rank: data-parallel SGD on train_single's global batches; returns
    (losses, final params)."""
    losses = np.zeros(steps)  # this rank's share of each step's loss
    for step in range(steps):
        idx = shard(comm, step, len(y), batch, seed)
        losses[step], params = data_parallel_step(comm, params, X[idx], y[idx], len(idx) / batch,
                                                  lr, bucket_bytes, algorithm)
    # the loss history: one all-reduce at the end
    return allreduce(comm, losses, op="sum", algorithm=algorithm), params


def seconds_per_step(comm, params: list, X, y, steps: int = 5, repeats: int = 3, lr: float = 0.1,
                     batch: int = 64, seed: int = 0, bucket_bytes: int | None = None,
                     algorithm: str = "ring") -> float:
    """Run on every rank: the median (over `repeats`) wall time of one data-parallel step, slowest
    rank's."""
    times = []
    for _ in range(repeats):
        comm.barrier()
        t0 = time.perf_counter()
        for step in range(steps):
            idx = shard(comm, step, len(y), batch, seed)
            data_parallel_step(comm, params, X[idx], y[idx], len(idx) / batch, lr, bucket_bytes,
                               algorithm)
        times.append((time.perf_counter() - t0) / steps)
    return float(allreduce(comm, np.array([np.median(times)]), op="max")[0])
