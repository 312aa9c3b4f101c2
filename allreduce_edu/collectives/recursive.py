"""Recursive doubling and Rabenseifner's halving-doubling all-reduce.
Introduced in lessons/04_tree_allreduce.

Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations in MPICH" (2005).
A world that is not a power of two first folds its extra ranks into partners and unfolds at the end.
"""

from __future__ import annotations

import numpy as np

from ..model import costmodel
from ..ops import OPS
from .registry import allreduce_algorithm, block_bounds, reduce_into


def _fold(comm, x: np.ndarray, op: str) -> tuple[np.ndarray | None, int, int]:
    """Fold N ranks into p = 2^⌊log2 N⌋: the first 2(N-p) ranks pair up and the even one hands
    over its data.

    Returns (data, new rank among the p, p); data is None for a rank that sits out until `_unfold`.
    """
    n, r = comm.world_size, comm.rank
    p = 1 << (n.bit_length() - 1)
    extra = n - p
    acc = x.copy()
    if r < 2 * extra:
        if r % 2 == 0:  # even: hand my data to r + 1 and wait for the result
            comm.send(r + 1, acc, "fold", step=0)
            return None, -1, p
        reduce_into(acc, comm.recv(r - 1, "fold"), op)  # odd: take in the even partner's data
        return acc, r // 2, p
    return acc, r - extra, p


def _unfold(comm, result: np.ndarray | None) -> np.ndarray:
    """Give the ranks that sat out the finished result."""
    extra = comm.world_size - (1 << (comm.world_size.bit_length() - 1))
    r = comm.rank
    if r < 2 * extra:
        if r % 2 == 0:
            return comm.recv(r + 1, "unfold")
        comm.send(r - 1, result, "unfold", step=0)
    return result


def _real_rank(new_rank: int, extra: int) -> int:
    return 2 * new_rank + 1 if new_rank < extra else new_rank + extra


@allreduce_algorithm("recursive_doubling", layout="hypercube",
                     phases=("fold", "exchange", "unfold"), cost=costmodel.recursive_doubling,
                     colour="#D55E00")
def allreduce_recursive_doubling(comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """Step s: swap whole buffers with rank XOR 2^s and reduce; log2 N steps, N·log2 N·S bytes."""
    acc, me, p = _fold(comm, x, op)
    extra = comm.world_size - p
    if acc is not None:
        distance, step = 1, 0
        while distance < p:
            # step s: exchange everything with partner = me XOR 2^s; both compute op(lower, higher)
            partner = me ^ distance
            theirs = comm.sendrecv(_real_rank(partner, extra), acc, _real_rank(partner, extra),
                                   "exchange", step=step)
            acc = OPS[op](acc, theirs) if me < partner else OPS[op](theirs, acc)
            distance, step = distance * 2, step + 1
    return _unfold(comm, acc)


def _reduce_scatter_halving(comm, flat: np.ndarray, bounds, me: int, p: int, extra: int,
                            op: str) -> tuple[int, int]:
    """Phase 1, recursive halving: log2 p steps, each halving the blocks this rank is responsible
    for; returns them, [lo, hi): one block, reduced over all p ranks (block b: flat[bounds[b]:
    bounds[b + 1]])."""
    lo, hi = 0, p
    distance, step = p // 2, 0
    while distance >= 1:
        # step s: halve [lo, hi); keep the half with my rank, send the other to me XOR distance
        partner, mid = me ^ distance, (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if me < partner else ((mid, hi), (lo, mid))
        peer = _real_rank(partner, extra)
        theirs = comm.sendrecv(peer, flat[bounds[give[0]]:bounds[give[1]]], peer,
                               "reduce_scatter", step=step, chunk=give)
        reduce_into(flat[bounds[keep[0]]:bounds[keep[1]]], theirs, op)
        (lo, hi), distance, step = keep, distance // 2, step + 1
    return lo, hi


def _all_gather_doubling(comm, flat: np.ndarray, bounds, me: int, p: int, extra: int,
                         lo: int, hi: int) -> None:
    """Phase 2, recursive doubling: log2 p steps, each swapping every finished block this rank
    holds with its partner's, so the finished part doubles until it is all of flat."""
    distance, step = 1, 0
    while distance < p:
        # step s: swap my finished blocks with me XOR distance; together we hold twice as many
        partner, width = me ^ distance, hi - lo
        theirs_lo, theirs_hi = (hi, hi + width) if me < partner else (lo - width, lo)
        peer = _real_rank(partner, extra)
        flat[bounds[theirs_lo]:bounds[theirs_hi]] = comm.sendrecv(
            peer, flat[bounds[lo]:bounds[hi]], peer, "all_gather", step=step, chunk=(lo, hi))
        lo, hi = min(lo, theirs_lo), max(hi, theirs_hi)
        distance, step = distance * 2, step + 1


@allreduce_algorithm("rabenseifner", layout="hypercube", bounds=block_bounds,
                     phases=("fold", "reduce_scatter", "all_gather", "unfold"),
                     cost=costmodel.rabenseifner, colour="#56B4E9")
def allreduce_rabenseifner(comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """Reduce-scatter by recursive halving, all-gather by doubling: 2 log2 N steps, ~2·S bytes."""
    acc, me, p = _fold(comm, x, op)  # a world that is not a power of two folds first
    extra = comm.world_size - p
    if acc is not None:
        flat = acc.reshape(-1)
        bounds = block_bounds(flat.size, p)  # the p blocks, as the registry cuts them
        lo, hi = _reduce_scatter_halving(comm, flat, bounds, me, p, extra, op)
        _all_gather_doubling(comm, flat, bounds, me, p, extra, lo, hi)
        acc = flat.reshape(x.shape)
    return _unfold(comm, acc)
