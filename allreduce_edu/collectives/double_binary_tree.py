"""NCCL's double binary tree all-reduce: two binary trees, each reducing and broadcasting half of
the buffer, pipelined in chunks. Introduced in lessons/04_tree_allreduce.

Sanders, Speck & Träff, "Two-tree algorithms for full bandwidth broadcast, reduction and scan"
(2009); Jeaugey, "Massively scale your deep learning training with NCCL 2.4" (2019).
Tree 1 is NCCL's in-order binary tree (`ncclGetBtree` in src/graph/trees.cc): odd ranks are leaves,
even ranks interior. Tree 2 is its mirror r -> N-1-r (even N), or tree 1 shifted by one rank
(odd N, `ncclGetDtree`), so a leaf of one tree is interior in the other (for odd N, rank 0 has one
child in each). Every rank then sends about 2·S, against the ring's 2(N-1)/N·S, in 2·depth + K - 1
steps for K chunks per tree instead of the ring's 2(N-1).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ..comm.base import check_array
from ..model import portsim
from ..model.links import Link
from ..ops import check_op
from .registry import allreduce_algorithm, reduce_into

# K chunks per tree cost about 4K·α per port but shorten the pipeline's fill and drain, so the
# model's time is least for K of order sqrt(S·β / α): K = sqrt(S / PIPELINE_BYTES), with
# PIPELINE_BYTES = α / β, the bytes a link moves in one α (the course's testbed: 10 ms · 100 MB/s)
PIPELINE_BYTES = 1_000_000
MAX_CHUNKS = 64  # per tree
# in flight, α no longer grows with K; what does is each rank's own cost per message (its
# transport's copies and wake-ups, about 1 ms on 8 ranks sharing 2 cores): K = sqrt(S /
# FLIGHT_BYTES), FLIGHT_BYTES the bytes a link moves in that time (100 MB/s · 1.3 ms)
FLIGHT_BYTES = 128 << 10


def btree(world_size: int, rank: int) -> tuple[int, list[int]]:
    """Tree 1 (ncclGetBtree): (parent or -1 for the root, children) of `rank`.

    Rank 0 is the root, with one child: the largest power of two below N. Otherwise, with b the
    lowest set bit of rank, the parent is rank ^ b | 2b (or rank ^ b past the end), and the
    children are rank - b/2 and rank + b/2 (or the largest rank + b/2^k that exists).
    """
    n = world_size
    bit = 1
    while bit < n and not bit & rank:  # the lowest set bit (rank 0: the power of two >= N)
        bit <<= 1
    if rank == 0:
        return -1, ([bit >> 1] if n > 1 else [])
    parent = (rank ^ bit) | (bit << 1)
    parent = parent if parent < n else rank ^ bit
    low = bit >> 1
    if not low:  # odd ranks are leaves
        return parent, []
    children = [rank - low]
    while low and rank + low >= n:  # the second child: the nearest of rank + b/2, b/4, ... in range
        low >>= 1
    return parent, children + ([rank + low] if low else [])


def mirror_tree(world_size: int, rank: int) -> tuple[int, list[int]]:
    """Tree 2 (ncclGetDtree): tree 1 mirrored, r -> N-1-r, for even N; shifted by one for odd N."""
    n = world_size
    if n % 2:  # odd: rank r plays tree 1's rank r-1
        parent, children = btree(n, (rank - 1) % n)
        return (-1 if parent < 0 else (parent + 1) % n), [(c + 1) % n for c in children]
    parent, children = btree(n, n - 1 - rank)
    return (-1 if parent < 0 else n - 1 - parent), [n - 1 - c for c in children]


@dataclass(frozen=True)
class Tree:
    """One tree of the world: every rank's parent and children, its height and depth."""

    parent: tuple[int, ...]
    children: tuple[tuple[int, ...], ...]
    height: tuple[int, ...]  # steps from the deepest leaf below (leaves: 0)
    depth: tuple[int, ...]  # steps from the root (root: 0)

    @classmethod
    def of(cls, world_size: int, shape) -> Tree:
        """The tree `shape(world_size, rank) -> (parent or -1, children)` describes, checked."""
        links = [shape(world_size, r) for r in range(world_size)]
        parent, children = [p for p, _ in links], [tuple(c) for _, c in links]
        _check(world_size, parent, children)
        depth, height = [0] * world_size, [0] * world_size
        order = [parent.index(-1)]  # top-down: every parent before its children
        for r in order:
            for c in children[r]:
                depth[c] = depth[r] + 1
                order.append(c)
        if len(order) != world_size:
            lost = sorted(set(range(world_size)) - set(order))
            raise ValueError(f"a tree of {world_size} ranks: ranks {lost} cannot be reached from "
                             f"the root {order[0]} (their parents form a cycle)")
        for r in reversed(order):
            height[r] = max((height[c] + 1 for c in children[r]), default=0)
        return cls(tuple(parent), tuple(children), tuple(height), tuple(depth))

    @property
    def root(self) -> int:
        return self.parent.index(-1)


def _check(n: int, parent: list[int], children: list[tuple[int, ...]]) -> None:
    """One root, and every child names its parent back (a tree's two descriptions agree)."""
    roots = [r for r in range(n) if parent[r] == -1]
    if len(roots) != 1:
        raise ValueError(f"a tree of {n} ranks has one root (parent -1); this one has {roots}")
    for r in range(n):
        for c in children[r]:
            if not 0 <= c < n or parent[c] != r:
                raise ValueError(f"a tree of {n} ranks: rank {r} names {c} as a child, but "
                                 f"rank {c} names {parent[c] if 0 <= c < n else None} as its "
                                 f"parent")
    for r in range(n):
        if parent[r] != -1 and r not in children[parent[r]]:
            raise ValueError(f"a tree of {n} ranks: rank {r} names {parent[r]} as its parent, "
                             f"but rank {parent[r]} does not name {r} as a child")


@functools.lru_cache(maxsize=64)
def trees(world_size: int) -> tuple[Tree, Tree]:
    """Tree 1 and tree 2 of a world."""
    return Tree.of(world_size, btree), Tree.of(world_size, mirror_tree)


def pipeline_chunks(nbytes: int, link: Link | None = None) -> int:
    """K, the chunks each tree cuts its half into, 1 to MAX_CHUNKS: sqrt(nbytes / PIPELINE_BYTES)
    where every message pays α on its ports; on in-flight links, where α overlaps and each
    message costs its rank's own time instead, sqrt(nbytes / FLIGHT_BYTES) (pass chunks= to
    double_binary_tree to choose)."""
    if link is not None and link.in_flight:
        return max(1, min(MAX_CHUNKS, round(math.sqrt(nbytes / FLIGHT_BYTES))))
    return max(1, min(MAX_CHUNKS, round(math.sqrt(nbytes / PIPELINE_BYTES))))


def schedule(world_size: int, chunks: int) -> list[tuple[int, str, int, int, int]]:
    """Every message, as (step, tag, piece, src, dst); piece t·K + c is chunk c of tree t's half.

    Reduce: a rank sends chunk c to its parent at step c + its height (its children's chunk c has
    arrived by then). Broadcast: the root sends chunk c down at step c; a rank at depth d passes it
    on at step c + d. Each phase takes K + height - 1 steps; both trees run at once.
    """
    messages = []
    for t, tree in enumerate(trees(world_size)):
        for c in range(chunks):
            piece = t * chunks + c
            for r in range(world_size):
                if tree.parent[r] >= 0:
                    messages.append((c + tree.height[r], "reduce", piece, r, tree.parent[r]))
                messages += [(c + tree.depth[r], "broadcast", piece, r, child)
                             for child in tree.children[r]]
    return messages


def double_binary_tree(comm, x, op: str = "sum", chunks: int | None = None) -> np.ndarray:
    """The algorithm with `chunks` per tree (default: pipeline_chunks for its size and links);
    one collective."""
    check_op(op, comm.rank)
    x = check_array(x, f"allreduce input on rank {comm.rank}")
    link = link_between_nodes(comm)
    with comm.collective("allreduce", algorithm="double_binary_tree", op=op, dtype=x.dtype,
                         shape=x.shape):
        return _pipelined(comm, x, chunks or pipeline_chunks(x.nbytes, link), op, link)


def link_between_nodes(comm) -> Link | None:
    """The emulated link between this world's nodes (None: no emulated links)."""
    return comm.links.inter if comm.links is not None else None


# without emulated links, ranks order their messages as on the course's testbed
NOMINAL = Link(10e-3, 1 / 100e6)


@functools.lru_cache(maxsize=32)
def programs(world_size: int, chunks: int, nbytes: float, link: Link | None = None) -> list:
    """Every rank's messages of schedule(...) in the order it issues them, as portsim.greedy
    finds them on `link` (each piece nbytes / 2K): whenever its port is free a rank takes in what
    has arrived, then sends the first chunk it has all the inputs of. Keys: (step, tag, piece,
    src, dst)."""
    messages, into = {}, {}
    for step, tag, piece, src, dst in schedule(world_size, chunks):
        key = (step, tag, piece, src, dst)
        piece_bytes = nbytes / (2 * chunks)
        messages[key] = (src, dst, piece_bytes, piece_bytes if tag == "reduce" else 0.0)
        into.setdefault((dst, piece, tag), set()).add(key)
    roots = [t.root for t in trees(world_size)]
    needs = {key: (into.get((src, piece, "reduce"), set())
                   if tag == "reduce" or src == roots[piece // chunks]
                   else into[(src, piece, "broadcast")])
             for key in messages for step, tag, piece, src, dst in [key]}
    link = link or NOMINAL
    return portsim.greedy(world_size, messages, needs, lambda src, dst: link)


def _pipelined(comm, x: np.ndarray, chunks: int, op: str, link: Link | None) -> np.ndarray:
    out = x.reshape(-1).copy()  # reduced in place, chunk by chunk, then overwritten by broadcasts
    pieces = np.array_split(out, 2 * chunks)  # views: tree 1 owns the first K, tree 2 the rest
    sends = []
    for kind, peer, (step, tag, piece, _, _), _ in programs(comm.world_size, chunks,
                                                           float(x.nbytes), link)[comm.rank]:
        if kind == "send":  # eager: the bytes are copied out, so a broadcast may overwrite them
            sends.append(comm.isend(peer, pieces[piece], tag, step=step, chunk=piece))
        elif tag == "reduce":  # a child's partial sum of this chunk
            reduce_into(pieces[piece], comm.recv(peer, tag), op)
        else:  # the finished chunk, from the parent
            pieces[piece][...] = comm.recv(peer, tag)
    for request in sends:
        request.wait()
    return out.reshape(x.shape)


def model(n: int, s: float, link: Link, link_of, gamma: float = 0.0,
          chunks: int | None = None) -> float:
    """Seconds every rank's program takes on one port per rank (portsim), `link_of(src, dst)` the
    Link a message crosses; `chunks` per tree (default: pipeline_chunks for `link`)."""
    k = chunks or pipeline_chunks(int(s), link)
    return portsim.run(programs(n, k, float(s), link), link_of, gamma)


def cost(n, s, alpha, beta, gamma=0.0):
    """Both trees at once, K chunks each, every rank issuing its messages in its program's order,
    on one full-duplex port per rank whose messages hold it for α + n·β (model/links.py)."""
    link = Link(alpha, beta)
    return model(n, s, link, lambda src, dst: link, gamma)


def link_cost(n, s, links):
    """The same programs on emulated `links` (in flight or not), as the testbed runs them."""
    return model(n, s, links.inter, links.link)


@allreduce_algorithm("double_binary_tree", layout="double_tree",
                     phases=("reduce", "broadcast"), cost=cost, link_cost=link_cost,
                     colour="#7B3294")
def allreduce_double_binary_tree(comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """Two mirrored binary trees each reduce and broadcast half the buffer, pipelined in chunks."""
    link = link_between_nodes(comm)
    return _pipelined(comm, x, pipeline_chunks(x.nbytes, link), op, link)
