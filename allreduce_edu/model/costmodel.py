"""The α-β(-γ) cost model, every formula in one place, one argument order.
Lessons 01, 05, 07 and 09.

α: seconds per message (latency); β: seconds per byte on the wire (1/bandwidth); γ: seconds per byte
reduced (compute); δ: seconds per byte normalised.
Hockney (1994); Thakur, Rabenseifner & Gropp (2005).
Every `predict*` takes (what, world_size, nbytes, then the machine). Each algorithm registers its
formula with `@allreduce_algorithm(..., cost=...)` (allreduce_edu.collectives.registry); this module
imports nothing of the package.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

COSTS: dict[str, Callable] = {}  # algorithm -> (world_size, nbytes, alpha, beta, gamma) -> seconds
# algorithm -> (world_size, nbytes, links) -> seconds on two-level links
LINK_COSTS: dict[str, Callable] = {}
NEEDS: dict[str, str] = {}  # algorithm -> what it needs besides messages ("windows": lesson 18)


def register(algorithm: str, cost: Callable | None, link_cost: Callable | None = None,
             needs: str = "") -> None:
    """Record an algorithm's formulas (None forgets them); called by its registration."""
    for table, formula in ((COSTS, cost), (LINK_COSTS, link_cost), (NEEDS, needs or None)):
        if formula is None:
            table.pop(algorithm, None)
        else:
            table[algorithm] = formula


# --- fitted on this machine -----------------------------------------------------------------------
def fit_alpha_beta(nbytes, seconds) -> tuple[float, float]:
    """Fit t = α + n·β to measured one-way times, minimising relative error
    (so 8 B counts as much as 16 MiB).

    Returns (α in seconds, β in seconds per byte).
    """
    nbytes, seconds = np.asarray(nbytes, float), np.asarray(seconds, float)
    if nbytes.size < 2 or np.ptp(nbytes) == 0:
        raise ValueError("fit_alpha_beta needs times for at least two different message sizes")
    beta, alpha = np.polyfit(nbytes, seconds, 1, w=1 / seconds)
    return max(float(alpha), 0.0), max(float(beta), 0.0)


def bus_factor(world_size: int) -> float:
    """busbw = algbw · 2(N-1)/N for all-reduce (nccl-tests' PERFORMANCE.md): comparable across N."""
    return 2 * (world_size - 1) / world_size


# --- one formula per algorithm: (world_size, nbytes, alpha, beta, gamma) -> seconds ---------------
def _log2(n: int) -> int:
    return (n - 1).bit_length()  # ⌈log2 n⌉


def _fold(n: int, s: float, alpha: float, beta: float, gamma: float) -> tuple[int, float]:
    """Recursive algorithms fold to p = 2^⌊log2 N⌋ ranks first:
    (p, the fold's and unfold's cost)."""
    p = 1 << (n.bit_length() - 1)
    return p, 0.0 if p == n else 2 * (alpha + s * beta) + s * gamma


def naive(n, s, alpha, beta, gamma=0.0):
    """The root receives N-1 buffers one after another, reduces them, then sends N-1 copies."""
    return 2 * (n - 1) * (alpha + s * beta) + (n - 1) * s * gamma


def all_to_all(n, s, alpha, beta, gamma=0.0):
    """Every rank sends its buffer to N-1 others and reduces N-1 buffers."""
    return (n - 1) * (alpha + s * beta) + (n - 1) * s * gamma


def ring(n, s, alpha, beta, gamma=0.0):
    """2(N-1) steps of S/N bytes; (N-1) reductions of S/N."""
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * s * beta + (n - 1) / n * s * gamma


def tree(n, s, alpha, beta, gamma=0.0):
    """⌈log2 N⌉ steps of S up the tree, ⌈log2 N⌉ down."""
    return 2 * _log2(n) * (alpha + s * beta) + _log2(n) * s * gamma


def recursive_doubling(n, s, alpha, beta, gamma=0.0):
    """log2 p exchanges of the whole buffer, after folding N to p ranks."""
    p, fold = _fold(n, s, alpha, beta, gamma)
    return math.log2(p) * (alpha + s * beta + s * gamma) + fold


def rabenseifner(n, s, alpha, beta, gamma=0.0):
    """Recursive halving then doubling: 2 log2 p steps, 2(p-1)/p·S bytes,
    after folding N to p ranks."""
    p, fold = _fold(n, s, alpha, beta, gamma)
    return 2 * math.log2(p) * alpha + 2 * (p - 1) / p * s * beta + (p - 1) / p * s * gamma + fold


def bruck(n, s, alpha, beta, gamma=0.0):
    """Bruck reduce-scatter + Bruck all-gather: 2⌈log2 N⌉ steps, the ring's 2(N-1)/N·S bytes."""
    return reduce_scatter_bruck(n, s, alpha, beta, gamma) + all_gather_bruck(n, s, alpha, beta)


# --- the halves, S = the whole buffer (reduce-scatter's input, all-gather's result) ---------------
def one_shot(n, s, alpha, beta, gamma=0.0):
    """Symmetric memory: one round of signals, then every rank reads the N−1 other buffers."""
    return alpha + (n - 1) * s * beta + (n - 1) * s * gamma


def two_shot(n, s, alpha, beta, gamma=0.0):
    """Symmetric memory: a reduce-scatter and an all-gather, each one round of signals."""
    return 2 * alpha + 2 * (n - 1) / n * s * beta + (n - 1) / n * s * gamma


def reduce_scatter_ring(n, s, alpha, beta, gamma=0.0):
    """N-1 steps of S/N; N-1 reductions of S/N."""
    return (n - 1) * (alpha + s / n * (beta + gamma))


def all_gather_ring(n, s, alpha, beta, gamma=0.0):
    """N-1 steps of S/N."""
    return (n - 1) * (alpha + s / n * beta)


def reduce_scatter_bruck(n, s, alpha, beta, gamma=0.0):
    """⌈log2 N⌉ steps that together send and reduce (N-1)/N·S."""
    return _log2(n) * alpha + (n - 1) / n * s * (beta + gamma)


def all_gather_bruck(n, s, alpha, beta, gamma=0.0):
    """⌈log2 N⌉ steps: 1, 2, 4, ... chunks of S/N, the last one what is left; (N-1)/N·S in all."""
    return _log2(n) * alpha + (n - 1) / n * s * beta


def predict(algorithm: str, world_size: int, nbytes: float, alpha: float, beta: float,
            gamma: float = 0.0) -> float:
    """Predicted seconds for an all-reduce of `nbytes` per rank on `world_size` ranks."""
    if algorithm not in COSTS:
        raise ValueError(f"no cost model for {algorithm!r}; known: {', '.join(COSTS)}")
    return (0.0 if world_size == 1
            else COSTS[algorithm](world_size, float(nbytes), alpha, beta, gamma))


# --- on emulated two-level links (links.Links): every step waits for its slowest message -----
def ring_on_links(n, s, links):
    """2(N-1) steps of S/N, every one crossing between nodes once there are two nodes."""
    slowest = links.inter if links.node(n - 1) > 0 else links.intra
    return ring(n, s, slowest.alpha, slowest.beta)


def tree_on_links(n, s, links):
    """⌈log2 N⌉ steps of S up and as many down, each pairing ranks 2^s apart."""
    distances = [1 << k for k in range((n - 1).bit_length())]
    # up: r → r - d; down: r → r + d
    up = sum(max(links.seconds(r, r - d, s) for r in range(d, n, 2 * d)) for d in distances)
    down = sum(max(links.seconds(r, r + d, s) for r in range(min(d, n - d))) for d in distances)
    return up + down


def hierarchical_on_links(n, s, links):
    """2(L-1) intra-node steps of S/L and 2(M-1) inter-node steps of S/(L·M), M = N/L nodes."""
    size = links.ranks_per_node if n % links.ranks_per_node == 0 else n
    if size == n:
        return ring_on_links(n, s, links)
    # reduce-scatter + all-gather in the node
    inside = ring(size, s, links.intra.alpha, links.intra.beta)
    # the inter-node ring
    return inside + ring(n // size, s / size, links.inter.alpha, links.inter.beta)


def predict_on_links(algorithm: str, world_size: int, nbytes: float, links) -> float | None:
    """Seconds the α-β model predicts on emulated `links` (None: no model for this algorithm
    there). On uniform links (Links.flat) every algorithm's own formula applies with their α, β."""
    formula = LINK_COSTS.get(algorithm)
    if formula is not None:
        return formula(world_size, float(nbytes), links)
    link = links.uniform
    if link is None or algorithm not in COSTS:
        return None
    return predict(algorithm, world_size, nbytes, link.alpha, link.beta)


# --- the fused Reduce + LayerNorm + Broadcast (lesson 07) -----------------------------------------
NORM_VARIANTS = ("ring all-reduce", "unfused", "root", "fused")


def predict_norm(variant: str, world_size: int, nbytes: float, alpha: float, beta: float,
                 gamma: float, delta: float) -> float:
    """Predicted seconds of a reduce_layernorm_broadcast variant (or the bare ring all-reduce)."""
    n, s = world_size, float(nbytes)
    all_reduce = predict("ring", n, s, alpha, beta, gamma)
    costs = {
        "ring all-reduce": all_reduce,
        "unfused": all_reduce + s * delta,  # every rank normalises all S bytes after the all-reduce
        # tree reduce + broadcast (⌈log2 N⌉ whole-tensor steps each), rank 0 normalises S on the way
        "root": predict("tree", n, s, alpha, beta, gamma) + s * delta,
        # the last reduce step (S/N) becomes add + norm: reads the same two inputs, so about δ per
        # byte instead of γ; 1/N of the norm work
        "fused": all_reduce - (s / n * gamma if n > 1 else 0.0) + s / n * delta,
    }
    if variant not in costs:
        raise ValueError(f"no model for {variant!r}; known: {', '.join(costs)}")
    return costs[variant]


def crossover(a: str, b: str, world_size: int, alpha: float, beta: float,
              gamma: float = 0.0) -> float | None:
    """The size in bytes where the model's times for algorithms `a` and `b` are equal (None: never).

    Every predicted time is a straight line c0 + c1·S in the size S, so the crossing is
    (c0_b − c0_a)/(c1_a − c1_b).
    """
    c0a = predict(a, world_size, 0, alpha, beta, gamma)
    c0b = predict(b, world_size, 0, alpha, beta, gamma)
    c1a = predict(a, world_size, 1, alpha, beta, gamma) - c0a
    c1b = predict(b, world_size, 1, alpha, beta, gamma) - c0b
    if math.isclose(c1a, c1b, rel_tol=1e-12, abs_tol=0.0):
        return None
    size = (c0b - c0a) / (c1a - c1b)
    return size if size > 0 else None
