"""Fewer bits per value: the mean over ranks in fp16 or bf16 (divide first), and FP8 (e4m3).

PyTorch's `fp16_compress_hook` and `bf16_compress_hook` (torch/distributed/algorithms/
ddp_comm_hooks/default_hooks.py) cast the gradient down and divide by the world size *before* the
all-reduce, "to avoid overflow, especially for FP16": fp16 tops out at 65504, so N gradients of
30000 overflow to inf when summed first (`divide_first=False` shows it), while each 30000/N fits.

    mean = allreduce_fp16(comm, x, algorithm="ring")     # any algorithm, or your fn(comm, x)
    mean = allreduce_bf16(comm, x)                       # bf16 sums hop by hop around the ring
    total = allreduce_fp8(comm, x, hops="once")          # e4m3 + a scale per chunk; or "ring"

fp16 runs on any of the package's all-reduces: float16 travels and np.add rounds each sum to
fp16, as NCCL's fp16 reduction does. The wire has no bf16 (comm/base.py WIRE_DTYPES) and adding
bit patterns means nothing, so bf16 travels as uint16 bits around a ring that decodes, adds and
re-encodes at every hop (exchange.py), as a ring reducing in bf16 does.
"""

from __future__ import annotations

import numpy as np

from ...collectives import allreduce
from .codecs import BF16, FP8
from .exchange import allreduce_encoded, encoded_bytes
from .formats import as_float32


def summing(algorithm):
    """fn(comm, x) -> the sum over ranks, for an algorithm name or a learner's function."""
    if callable(algorithm):
        return algorithm
    return lambda comm, x: allreduce(comm, x, "sum", algorithm)


def check_float(comm, x) -> np.ndarray:
    """x as an array, if it is floating point; else a TypeError that says what to do."""
    x = np.asarray(x)
    if x.dtype.kind != "f":
        raise TypeError(f"rank {comm.rank}: compression works on floating-point gradients, got "
                        f"dtype {x.dtype}; all-reduce integers with allreduce()")
    return x


def allreduce_fp16(comm, x, algorithm="ring", divide_first: bool = True) -> np.ndarray:
    """The mean of x over the ranks, sent as float16 (x's dtype back): x cast to fp16, divided by
    N in fp16, summed by `algorithm` in fp16, as torch's fp16_compress_hook; `divide_first=False`
    sums first and divides after, and overflows where the sum passes 65504."""
    x = check_float(comm, x)
    n = comm.world_size
    half = as_float32(x).astype(np.float16)  # float64 goes through float32, as torch's cast does
    if divide_first:
        half = half / np.float16(n)  # one fp16 rounding, as torch's div_
    total = np.asarray(summing(algorithm)(comm, half))
    return total.astype(x.dtype) if divide_first else total.astype(x.dtype) / n


def allreduce_bf16(comm, x, divide_first: bool = True) -> np.ndarray:
    """The mean of x over the ranks in bfloat16 (x's dtype back), as torch's bf16_compress_hook:
    cast, divide by N in bf16, then sum in bf16 around the ring (uint16 bits on the wire)."""
    x = check_float(comm, x)
    n = comm.world_size
    rounded = BF16.round(x)  # every rank starts from its bf16 value
    if divide_first:
        rounded = BF16.round(rounded / np.float32(n))
    total = allreduce_encoded(comm, rounded.reshape(x.shape), BF16, hops="ring")
    return total.astype(x.dtype) if divide_first else total.astype(x.dtype) / n


def allreduce_fp8(comm, x, hops: str = "once") -> np.ndarray:
    """The sum of x over the ranks in FP8 e4m3 with a float32 scale per chunk (x's dtype back):
    quantized twice whatever N is (`hops="once"`, torchft's way), or at every hop of a ring."""
    return allreduce_encoded(comm, check_float(comm, x), FP8, hops)


def ring_bytes(world_size: int, nbytes: int) -> int:
    """Bytes all ranks send in a ring all-reduce of `nbytes`: 2(N-1)·S (N-1 hops for each chunk,
    in each phase); the naive and tree all-reduces move the same total."""
    return 2 * (world_size - 1) * nbytes


def fp16_bytes(count: int, world_size: int) -> int:
    """Bytes all ranks send for an fp16 ring all-reduce of `count` values: 2(N-1)·2·count."""
    return ring_bytes(world_size, 2 * count)


def bf16_bytes(count: int, world_size: int) -> int:
    """Bytes all ranks send for a bf16 all-reduce of `count` values: 2(N-1)·2·count."""
    return encoded_bytes(BF16, count, world_size)


def fp8_bytes(count: int, world_size: int) -> int:
    """Bytes all ranks send for an FP8 all-reduce of `count` values, either way:
    2(N-1)·(count + 4N) (one byte a value, a 4-byte scale per chunk)."""
    return encoded_bytes(FP8, count, world_size)
