"""Binomial-tree reduce and broadcast, and tree all-reduce. Introduced in lessons/04_tree_allreduce.

⌈log2 N⌉ steps per phase instead of the ring's N-1, but every step moves the whole buffer.
"""

from __future__ import annotations

import numpy as np

from ..model import costmodel
from .registry import allreduce_algorithm, reduce_into


def reduce_tree(comm, x: np.ndarray, op: str = "sum", root: int = 0) -> np.ndarray:
    """Binomial-tree reduce: the reduction lands on `root`;
    other ranks return their partial sums."""
    n = comm.world_size
    vrank = (comm.rank - root) % n  # rank counted from the root
    acc = x.copy()
    step, distance = 0, 1
    while distance < n:
        # step s: ranks with bit s set send their partial to vrank - 2^s and are done
        if vrank & distance:
            comm.send((vrank - distance + root) % n, acc, "reduce", step=step)
            break
        if vrank + distance < n:  # ... the others add what vrank + 2^s sends
            reduce_into(acc, comm.recv((vrank + distance + root) % n, "reduce"), op)
        step, distance = step + 1, distance * 2
    return acc


def broadcast_tree(comm, x: np.ndarray, root: int = 0) -> np.ndarray:
    """Binomial-tree broadcast: every rank returns root's `x` after ⌈log2 N⌉ steps."""
    n = comm.world_size
    vrank = (comm.rank - root) % n
    data = x.copy() if vrank == 0 else None
    for step in range((n - 1).bit_length()):
        distance = 1 << step
        # step s: the 2^s ranks that hold the data send it to vrank + 2^s
        if vrank < distance and vrank + distance < n:
            comm.send((vrank + distance + root) % n, data, "broadcast", step=step)
        elif distance <= vrank < 2 * distance:
            data = comm.recv((vrank - distance + root) % n, "broadcast")
    return data


@allreduce_algorithm("tree", layout="tree", phases=("reduce", "broadcast"), cost=costmodel.tree,
                     link_cost=costmodel.tree_on_links, colour="#009E73")
def allreduce_tree(comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """Tree all-reduce = binomial reduce to rank 0 + binomial broadcast from it."""
    return broadcast_tree(comm, reduce_tree(comm, x, op, root=0), root=0)
