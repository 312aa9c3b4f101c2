"""Hierarchical all-reduce, as NCCL and Horovod run it across nodes. Introduced in lessons/05.

Intra-node reduce-scatter → inter-node all-reduce among the ranks with the same local index →
intra-node all-gather. Only 1/L of the buffer crosses the slow network from each rank, and only the
M nodes (not all N ranks) take turns on it.
Sergeev & Del Balso, "Horovod" (2018); Jeaugey, NCCL 2.4.

Nodes are ranks_per_node (L) consecutive ranks: `comm.ranks_per_node`, which a Cluster with
two-level `links` and allreduce_edu.init (the launch's ranks per node) set. Unknown, or not a
divisor of world_size: the whole world is one node, and the algorithm is exactly the ring.
"""

from __future__ import annotations

import numpy as np

from ..comm.group import Group
from ..model import costmodel
from .registry import ALGORITHMS, allreduce_algorithm
from .ring import all_gather_ring, reduce_scatter_ring


def node_size(comm) -> int:
    """L for this world: comm.ranks_per_node when it divides world_size,
    else the whole world (one node)."""
    n, size = comm.world_size, comm.ranks_per_node
    return size if isinstance(size, int) and 0 < size <= n and n % size == 0 else n


def hierarchical(comm, x: np.ndarray, op: str = "sum", ranks_per_node: int | None = None,
                 inter: str = "ring"):
    """The algorithm, with L ranks per node (default: `node_size(comm)`) and `inter` among the
    nodes; one collective of the whole world (its groups' messages belong to it)."""
    with comm.collective("allreduce", algorithm="hierarchical", op=op, dtype=x.dtype,
                         shape=x.shape):
        return _phases(comm, x, op, ranks_per_node, inter)


def _phases(comm, x: np.ndarray, op: str, ranks_per_node: int | None, inter: str) -> np.ndarray:
    n = comm.world_size
    size = ranks_per_node or node_size(comm)
    size = size if n % size == 0 else n
    node, local = divmod(comm.rank, size)
    intra = Group(comm, [node * size + i for i in range(size)], "intra")  # my node's ranks
    # local index `local` on every node
    across = Group(comm, [m * size + local for m in range(n // size)], "inter")
    pieces = np.array_split(x.reshape(-1).copy(), size)  # L pieces; local rank l will own piece l

    # phase 1, intra-node reduce-scatter: local rank l ends with piece l reduced over its node
    reduce_scatter_ring(intra, pieces, op)
    # phase 2, inter-node all-reduce of piece l among the ranks with local index l (one per node)
    pieces[local] = ALGORITHMS[inter](across, pieces[local], op)
    # phase 3, intra-node all-gather: every rank of the node gets every finished piece
    all_gather_ring(intra, pieces)
    return np.concatenate(pieces).reshape(x.shape)


@allreduce_algorithm("hierarchical", layout="ring", cost=costmodel.ring,
                     link_cost=costmodel.hierarchical_on_links,
                     phases=("intra/reduce_scatter", "inter/reduce_scatter", "inter/all_gather",
                             "intra/all_gather"),
                     colour="#000000")  # on a flat network every rank is its own node: the ring
def allreduce_hierarchical(comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """Reduce-scatter in the node, all-reduce across nodes (ring), all-gather in the node."""
    return hierarchical(comm, x, op)
