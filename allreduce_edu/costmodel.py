"""The α-β(-γ) cost model: predicted time of each algorithm, and α, β fitted on this machine. Lessons 01, 05.

α: seconds per message (latency); β: seconds per byte on the wire (1/bandwidth); γ: seconds per byte
reduced (compute). Hockney (1994); Thakur, Rabenseifner & Gropp (2005) for the per-algorithm costs.
"""

from __future__ import annotations

import math

import numpy as np


def fit_alpha_beta(nbytes, seconds) -> tuple[float, float]:
    """Fit t = α + n·β to measured one-way times, minimising relative error (so 8 B counts as much as 16 MiB).

    Returns (α in seconds, β in seconds per byte).
    """
    nbytes, seconds = np.asarray(nbytes, float), np.asarray(seconds, float)
    if nbytes.size < 2 or np.ptp(nbytes) == 0:
        raise ValueError("fit_alpha_beta needs times for at least two different message sizes")
    beta, alpha = np.polyfit(nbytes, seconds, 1, w=1 / seconds)
    return max(float(alpha), 0.0), max(float(beta), 0.0)


def _log2(n: int) -> int:
    return (n - 1).bit_length()  # ⌈log2 n⌉


def predict(algorithm: str, world_size: int, nbytes: float, alpha: float, beta: float, gamma: float = 0.0) -> float:
    """Predicted seconds for an all-reduce of `nbytes` per rank on `world_size` ranks."""
    n, s = world_size, float(nbytes)
    if n == 1:
        return 0.0
    p = 1 << (n.bit_length() - 1)  # recursive algorithms fold to a power of two first
    fold = 0.0 if p == n else 2 * (alpha + s * beta) + s * gamma
    costs = {
        # root receives N-1 buffers one after another, reduces them, then sends N-1 copies
        "naive": 2 * (n - 1) * (alpha + s * beta) + (n - 1) * s * gamma,
        # every rank sends its buffer to N-1 others and reduces N-1 buffers
        "all_to_all": (n - 1) * (alpha + s * beta) + (n - 1) * s * gamma,
        # 2(N-1) steps of S/N bytes; (N-1) reductions of S/N
        "ring": 2 * (n - 1) * alpha + 2 * (n - 1) / n * s * beta + (n - 1) / n * s * gamma,
        # ⌈log2 N⌉ steps of S up the tree, ⌈log2 N⌉ down
        "tree": 2 * _log2(n) * (alpha + s * beta) + _log2(n) * s * gamma,
        "recursive_doubling": math.log2(p) * (alpha + s * beta + s * gamma) + fold,
        "rabenseifner": 2 * math.log2(p) * alpha + 2 * (p - 1) / p * s * beta + (p - 1) / p * s * gamma + fold,
    }
    costs["hierarchical"] = costs["ring"]  # on a flat network every rank is its own node: the ring
    if algorithm not in costs:
        raise ValueError(f"no cost model for {algorithm!r}; known: {', '.join(costs)}")
    return costs[algorithm]


def bus_factor(world_size: int) -> float:
    """busbw = algbw · 2(N-1)/N for all-reduce (nccl-tests' PERFORMANCE.md): comparable across N."""
    return 2 * (world_size - 1) / world_size
