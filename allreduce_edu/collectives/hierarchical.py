"""Hierarchical all-reduce, as NCCL and Horovod run it across nodes. Introduced in lessons/05.

Intra-node reduce-scatter → inter-node all-reduce among the ranks with the same local index →
intra-node all-gather. Only 1/L of the buffer crosses the slow network from each rank, and only the
M nodes (not all N ranks) take turns on it. Sergeev & Del Balso, "Horovod" (2018); Jeaugey, NCCL 2.4.

Nodes are ranks_per_node (L) consecutive ranks. L comes from `comm.links` (a two-level `Links`), else
`comm.ranks_per_node` (allreduce_edu.init sets it to the launch's ranks per node). Unknown, or not a
divisor of world_size: the whole world is one node, and the algorithm is exactly the ring.
"""

from __future__ import annotations

import numpy as np

from ..costmodel import predict as predict_flat
from .ops import ALGORITHMS, allreduce_algorithm
from .ring import all_gather_ring, reduce_scatter_ring


class Group:
    """Some ranks of `comm` seen as a world of their own: ranks renumbered 0..len(ranks)-1, tags prefixed."""

    def __init__(self, comm, ranks: list[int], name: str):
        self.comm, self.ranks, self.name = comm, ranks, name
        self.rank, self.world_size = ranks.index(comm.rank), len(ranks)

    def isend(self, dst, array, tag, **kw):
        return self.comm.isend(self.ranks[dst], array, f"{self.name}/{tag}", **kw)

    def send(self, dst, array, tag, **kw):
        self.comm.send(self.ranks[dst], array, f"{self.name}/{tag}", **kw)

    def recv(self, src, tag, timeout=None):
        return self.comm.recv(self.ranks[src], f"{self.name}/{tag}", timeout)

    def sendrecv(self, dst, array, src, tag, **kw):
        return self.comm.sendrecv(self.ranks[dst], array, self.ranks[src], f"{self.name}/{tag}", **kw)

    def collective(self, *args, **kwargs):
        return self.comm.collective(*args, **kwargs)  # nested inside the hierarchical all-reduce: one collective


def ranks_per_node(comm) -> int:
    """L for this world: from comm.links, else comm.ranks_per_node; the whole world when unknown or uneven."""
    n = comm.world_size
    size = getattr(getattr(comm, "links", None), "ranks_per_node", None) or getattr(comm, "ranks_per_node", None)
    return size if isinstance(size, int) and 0 < size <= n and n % size == 0 else n


def hierarchical(comm, x: np.ndarray, op: str = "sum", node_size: int | None = None, inter: str = "ring"):
    """The algorithm's body: L ranks per node (default: `ranks_per_node(comm)`), `inter` among the nodes."""
    n = comm.world_size
    size = node_size or ranks_per_node(comm)
    size = size if n % size == 0 else n
    node, local = divmod(comm.rank, size)
    intra = Group(comm, [node * size + i for i in range(size)], "intra")  # my node's ranks
    across = Group(comm, [m * size + local for m in range(n // size)], "inter")  # local index `local` on every node
    pieces = np.array_split(x.reshape(-1).copy(), size)  # L pieces; local rank l will own piece l

    # phase 1, intra-node reduce-scatter: local rank l ends with piece l reduced over its node
    reduce_scatter_ring(intra, pieces, op)
    # phase 2, inter-node all-reduce of piece l among the ranks with local index l (one per node)
    pieces[local] = ALGORITHMS[inter](across, pieces[local], op)
    # phase 3, intra-node all-gather: every rank of the node gets every finished piece
    all_gather_ring(intra, pieces)
    return np.concatenate(pieces).reshape(x.shape)


@allreduce_algorithm("hierarchical")
def allreduce_hierarchical(comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """Reduce-scatter in the node, all-reduce across nodes (ring), all-gather in the node."""
    return hierarchical(comm, x, op)


def predict(world_size: int, nbytes: float, links, algorithm: str = "hierarchical") -> float | None:
    """Seconds the α-β model predicts on two-level `links` for ring, tree or hierarchical (None: no model here).

    Every step waits for its slowest message. ring: 2(N-1) steps of S/N, inter-node ones once there are two
    nodes. tree: ⌈log2 N⌉ steps of S up and as many down, each pairing ranks 2^s apart.
    hierarchical: 2(L-1) intra-node steps of S/L and 2(M-1) inter-node steps of S/(L·M), M = N/L nodes.
    """
    n, s = world_size, float(nbytes)
    size = links.ranks_per_node if n % links.ranks_per_node == 0 else n
    if algorithm == "tree":
        distances = [1 << k for k in range((n - 1).bit_length())]
        up = sum(max(links.seconds(r, r - d, s) for r in range(d, n, 2 * d)) for d in distances)  # r → r - d
        down = sum(max(links.seconds(r, r + d, s) for r in range(min(d, n - d))) for d in distances)  # r → r + d
        return up + down
    if algorithm == "ring" or (algorithm == "hierarchical" and size == n):
        slowest = links.inter if links.node(n - 1) > 0 else links.intra
        return predict_flat("ring", n, s, slowest.alpha, slowest.beta)
    if algorithm != "hierarchical":
        return None
    nodes = n // size
    inside = predict_flat("ring", size, s, links.intra.alpha, links.intra.beta)  # reduce-scatter + all-gather
    across = predict_flat("ring", nodes, s / size, links.inter.alpha, links.inter.beta)  # the inter-node ring
    return inside + across
