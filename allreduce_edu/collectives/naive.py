"""Naive all-reduce: everything through one root, or everything to everyone.
Introduced in lessons/02.

Simple and correct, but the root moves (N-1)·S bytes each way: it is the bottleneck.
"""

from __future__ import annotations

import numpy as np

from ..model import costmodel
from .registry import allreduce_algorithm, reduce_into


@allreduce_algorithm("naive", layout="star", phases=("reduce", "broadcast"), cost=costmodel.naive,
                     colour="#E69F00")
def allreduce_naive(comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """Reduce to rank 0, then broadcast from it; one message per rank each way."""
    if comm.rank != 0:
        comm.send(0, x, "reduce", step=0)
        return comm.recv(0, "broadcast")
    acc = x.copy()
    for src in range(1, comm.world_size):  # in rank order, so every run sums in the same order
        reduce_into(acc, comm.recv(src, "reduce"), op)
    sends = [comm.isend(dst, acc, "broadcast", step=0) for dst in range(1, comm.world_size)]
    for request in sends:
        request.wait()
    return acc


@allreduce_algorithm("all_to_all", layout="star", phases=("exchange",), cost=costmodel.all_to_all,
                     colour="#CC79A7")
def allreduce_all_to_all(comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """Every rank sends its whole buffer to every other and reduces all N (one step, (N-1)·S each).

    Not MPI's Alltoall (which sends a different piece to each rank): the naive direct exchange.
    """
    n, r = comm.world_size, comm.rank
    # rank r sends to r+1, r+2, ... in turn: at each moment every rank sends to a different one,
    # so no receiver's port is asked for twice at once (all sending to rank 0 first would be)
    sends = [comm.isend((r + k) % n, x, "exchange", step=0) for k in range(1, n)]
    contributions = [x if src == comm.rank else comm.recv(src, "exchange") for src in range(n)]
    for request in sends:
        request.wait()
    acc = contributions[0].copy()
    for contribution in contributions[1:]:  # in rank order: every rank computes identical bits
        reduce_into(acc, contribution, op)
    return acc
