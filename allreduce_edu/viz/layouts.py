"""Where the ranks sit in a step animation, by the layout an algorithm's description names: ring,
star, tree, hypercube, double_tree, circle. Lessons 02-05.
"""

from __future__ import annotations

import math

from ..collectives.double_binary_tree import trees
from ..collectives.registry import describe
from ..trace import Trace
from .animation import StepAnimation

TREE_COLOURS = ("#0072B2", "#E69F00")  # tree 1, tree 2 (Okabe-Ito blue and orange)


class RingAnimation(StepAnimation):
    """Ranks on a circle, rank 0 at the top, clockwise: ring, all-gather, reduce-scatter and custom
    algorithms."""

    directed = True  # rank r sends to r + 1
    def unit_layout(self, world_size):
        if world_size == 1:
            return [(0.0, 0.0)]
        return [(math.sin(2 * math.pi * r / world_size), math.cos(2 * math.pi * r / world_size))
                for r in range(world_size)]

    def edges(self):
        n = self.world_size
        return [(r, (r + 1) % n) for r in range(n)] if n > 1 else []


class CircleAnimation(RingAnimation):
    """Ranks on a circle with no ring drawn: Bruck's steps jump 1, 2, 4, ... ranks along it."""

    directed = False

    def edges(self):
        return []


class DoubleTreeAnimation(StepAnimation):
    """NCCL's double binary tree: ranks left to right in rank order (both trees are in-order), the
    ranks interior in tree 1 above, by depth from its root at the top, the others below, by depth
    from tree 2's root at the bottom; each tree's links in its own colour (TREE_COLOURS)."""

    def unit_layout(self, world_size):
        first, second = trees(world_size)
        upper = [r for r in range(world_size) if first.children[r] or r == first.root]
        rows = 1 + max(first.depth[r] for r in upper)
        levels = rows + 1 + max((second.depth[r] for r in range(world_size) if r not in upper),
                                default=-1)
        level = {r: (first.depth[r] if r in upper else levels - 1 - second.depth[r])
                 for r in range(world_size)}
        x = _spread(list(range(world_size)), world_size)
        return [(x[r], _level(level[r], levels)) for r in range(world_size)]

    def edges(self):
        return [(r, parent, colour)
                for tree, colour in zip(trees(self.world_size), TREE_COLOURS, strict=True)
                for r, parent in enumerate(tree.parent) if parent >= 0]


class NaiveAnimation(StepAnimation):
    """A star: rank 0 in the middle, the others around it (naive and all-to-all)."""

    def unit_layout(self, world_size):
        around = world_size - 1
        return [(0.0, 0.0)] + [(math.sin(2 * math.pi * k / around),
                                math.cos(2 * math.pi * k / around)) for k in range(around)]

    def edges(self):
        return [(0, r) for r in range(1, self.world_size)]


class TreeAnimation(StepAnimation):
    """Ranks in rows by the number of 1-bits in their rank: a binomial tree (tree) or a hypercube
    (recursive).

    In a world that is not a power of two, the recursive algorithms' folded-away ranks sit in a
    bottom row.
    """

    @property
    def _hypercube(self) -> bool:
        algorithm = describe(self.collective)
        return algorithm is not None and algorithm.layout == "hypercube"

    def _participants(self):
        """(p, map from a rank among the p to its real rank, the ranks that sit out)."""
        n = self.world_size
        if not self._hypercube:
            return n, list(range(n)), []
        p = 1 << (n.bit_length() - 1)
        extra = n - p
        return (p, [2 * k + 1 if k < extra else k + extra for k in range(p)],
                [2 * k for k in range(extra)])

    def unit_layout(self, world_size):
        p, real, sitting_out = self._participants()
        rows: list[list[int]] = [[] for _ in range(p.bit_length())]
        for v in range(p):
            rows[bin(v).count("1")].append(v)
        rows = [row for row in rows if row]
        widest, levels = (max(len(row) for row in rows + [sitting_out]),
                          len(rows) + bool(sitting_out))
        u: dict[int, float] = {}
        # each rank under its parent (v without its lowest 1-bit), so few links cross
        for row in rows:
            row.sort(key=lambda v: (u.get(v & (v - 1), 0.0), v))
            u.update(_spread(row, widest))
        unit = {real[v]: (u[v], _level(i, levels)) for i, row in enumerate(rows) for v in row}
        if sitting_out:  # below, in the order of their partners
            row = sorted(sitting_out, key=lambda r: unit[r + 1][0])
            unit.update({r: (x, -1.0) for r, x in _spread(row, widest).items()})
        return [unit[r] for r in range(world_size)]

    def edges(self):
        p, real, sitting_out = self._participants()
        if not self._hypercube:
            return [(v, v & (v - 1)) for v in range(1, p)]
        links = [(real[v], real[v ^ (1 << s)])
                 for v in range(p) for s in range(p.bit_length() - 1) if v < v ^ (1 << s)]
        return links + [(r, r + 1) for r in sitting_out]


def _level(i: int, levels: int) -> float:
    return 1 - 2 * i / (levels - 1) if levels > 1 else 0.0


def _spread(row: list[int], widest: int) -> dict[int, float]:
    """Evenly spaced u positions for a row, centred, with the widest row spanning [-1, 1]."""
    gap = 2 / (widest - 1) if widest > 1 else 0.0
    return {v: (j - (len(row) - 1) / 2) * gap for j, v in enumerate(row)}


def animate(source, values=None, **kwargs) -> StepAnimation:
    """The right animation for a Cluster (its last run) or a Trace: the layout its algorithm's
    description gives."""
    trace, world_size = ((source, None) if isinstance(source, Trace)
                         else (source.trace, source.world_size))
    names = {e.collective for e in trace.events}
    name = kwargs.get("collective") or (names.pop() if len(names) == 1 else "")
    algorithm = describe(name)
    cls = LAYOUTS[algorithm.layout if algorithm else "ring"]
    return cls(trace, world_size, values, **kwargs)


LAYOUTS = {"ring": RingAnimation, "star": NaiveAnimation, "tree": TreeAnimation,
           "hypercube": TreeAnimation, "double_tree": DoubleTreeAnimation,
           "circle": CircleAnimation}
