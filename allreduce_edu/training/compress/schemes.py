"""A compression scheme: how a flat gradient bucket's mean over the ranks travels, and its bytes.

    scheme.mean(comm, flat, shapes, key=0, last=True)  # ≈ the mean of flat over the ranks
    scheme.bytes_per_step(shapes, dtype, world_size, step=0)  # bytes all ranks send for it

`flat` is one bucket of gradients (as DDP hands a hook, or as compress.train packs a model's), the
concatenation of tensors of `shapes`; `key` names the bucket (its state, for the schemes that keep
some); `last` marks the step's last bucket (PowerSGD counts steps by it). Every rank calls with
the same shapes and keys in the same order. The byte formulas are for the ring all-reduce.
"""

from __future__ import annotations

import math

import numpy as np

from .casts import (
    allreduce_bf16,
    allreduce_fp8,
    allreduce_fp16,
    bf16_bytes,
    fp8_bytes,
    fp16_bytes,
    ring_bytes,
    summing,
)


def count(shapes) -> int:
    """Values in tensors of these shapes."""
    return sum(math.prod(s) for s in shapes)


class Scheme:
    """No compression: the exact mean (the reference every other scheme is measured against)."""

    name = "plain"

    def __init__(self, algorithm="ring"):
        self.algorithm = algorithm  # a name in ALGORITHMS, or fn(comm, x) -> the sum over ranks
        self.summed = summing(algorithm)

    def mean(self, comm, flat, shapes=None, key=0, last=True) -> np.ndarray:
        return np.asarray(self.summed(comm, flat)) / comm.world_size

    def bytes_per_step(self, shapes, dtype, world_size: int, step: int = 0) -> int:
        return ring_bytes(world_size, count(shapes) * np.dtype(dtype).itemsize)

    def __repr__(self) -> str:
        algorithm = getattr(self.algorithm, "__name__", self.algorithm)  # a name, or a function
        return f"{type(self).__name__}({algorithm!r})"


class FP16(Scheme):
    """fp16 on the wire, divided by N first (torch's fp16_compress_hook)."""

    name = "fp16"

    def __init__(self, algorithm="ring", divide_first: bool = True):
        super().__init__(algorithm)
        self.divide_first = divide_first

    def mean(self, comm, flat, shapes=None, key=0, last=True):
        return allreduce_fp16(comm, flat, self.summed, self.divide_first)

    def bytes_per_step(self, shapes, dtype, world_size, step=0):
        return fp16_bytes(count(shapes), world_size)


class BF16(Scheme):
    """bf16 on the wire (uint16 bits), divided by N first, summed in bf16 around the ring."""

    name = "bf16"

    def __init__(self):
        super().__init__("ring")

    def mean(self, comm, flat, shapes=None, key=0, last=True):
        return allreduce_bf16(comm, flat)

    def bytes_per_step(self, shapes, dtype, world_size, step=0):
        return bf16_bytes(count(shapes), world_size)


class FP8(Scheme):
    """e4m3 with a scale per chunk: quantized twice (hops="once"), or at every ring hop."""

    name = "fp8"

    def __init__(self, hops: str = "once"):
        super().__init__("ring")
        self.hops = hops

    def mean(self, comm, flat, shapes=None, key=0, last=True):
        return allreduce_fp8(comm, flat, self.hops) / comm.world_size

    def bytes_per_step(self, shapes, dtype, world_size, step=0):
        return fp8_bytes(count(shapes), world_size)

    def __repr__(self) -> str:
        return f"FP8(hops={self.hops!r})"
