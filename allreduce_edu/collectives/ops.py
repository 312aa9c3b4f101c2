"""Reduction ops (sum, prod, max, min) and the checks every collective makes before sending anything."""

from __future__ import annotations

import functools

import numpy as np

from ..comm.base import check_array

OPS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}  # names as in NCCL/MPI
ALGORITHMS: dict[str, callable] = {}  # filled by @allreduce_algorithm in each algorithm's module


def check_op(comm, op: str) -> str:
    if op not in OPS:
        raise ValueError(f"rank {comm.rank}: unknown op {op!r}; valid ops: {', '.join(OPS)}")
    return op


def check_root(comm, root) -> int:
    if not isinstance(root, (int, np.integer)) or not 0 <= root < comm.world_size:
        raise ValueError(f"rank {comm.rank}: root={root!r} is outside the world: valid roots are "
                         f"0..{comm.world_size - 1}")
    return int(root)


def reduce_into(acc: np.ndarray, x: np.ndarray, op: str) -> np.ndarray:
    """acc = op(acc, x), elementwise, in place."""
    return OPS[op](acc, x, out=acc)


def allreduce_algorithm(name: str):
    """Register `body(comm, x, op)` as all-reduce algorithm `name`, with the checks every algorithm needs.

    The wrapper validates `op`, makes `x` a contiguous array of a wire dtype (lists convert as
    `np.asarray` does), and marks the messages inside as one collective so ranks that call it
    differently fail with CollectiveMismatch. The body never sees (or changes) the caller's array.
    """
    def register(body):
        @functools.wraps(body)
        def allreduce_with(comm, x, op: str = "sum") -> np.ndarray:
            check_op(comm, op)
            x = check_array(x, f"allreduce input on rank {comm.rank}")
            with comm.collective("allreduce", algorithm=name, op=op, dtype=x.dtype, shape=x.shape):
                return body(comm, x, op)
        ALGORITHMS[name] = allreduce_with
        return allreduce_with
    return register
