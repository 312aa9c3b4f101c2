"""Lesson 05's number exercise as data (05.2); lesson05.py re-exports its checker."""

from __future__ import annotations

from ..model.costmodel import predict
from .spec import Blank, Slip, number

LESSON = "allreduce_edu.exercises.lesson05"  # where the notebook imports it from

#: 05.2's cluster: the ring timed on 16 ranks at two sizes (seconds); the tree asked at 1 MiB
RING_TIMES = {8: 300e-6, 64 << 20: 6.59e-3}


def _fit_ring(d) -> tuple[float, float]:
    """(α, β) that put the ring's formula on d.world_size ranks through both measured times."""
    (s1, t1), (s2, t2) = sorted(d.ring_times.items())
    n = d.world_size
    steps, share = 2 * (n - 1), 2 * (n - 1) / n
    beta = (t2 - t1) / (share * (s2 - s1))
    return (t1 - share * s1 * beta) / steps, beta


def _tree_us(d, alpha: float, beta: float, phases: int = 2) -> float:
    return phases * (d.world_size - 1).bit_length() * (alpha + d.nbytes * beta) * 1e6


def _tree_answer(d) -> float:
    return _tree_us(d, *_fit_ring(d))


def _tree_slips(d) -> list[Slip]:
    alpha, beta = _fit_ring(d)
    (s1, t1), (s2, t2) = sorted(d.ring_times.items())
    want, share = _tree_answer(d), 2 * (d.world_size - 1) / d.world_size
    return [
        Slip(want / 1e6, "that looks like seconds: the checker wants µs."),
        Slip(want / 1e3, "that looks like milliseconds: the checker wants µs."),
        Slip(_tree_us(d, alpha, beta, phases=1), "the tree has two phases, reduce and broadcast: "
             "2·⌈log2 N⌉ steps, each moving the whole buffer."),
        Slip(2 * want, "the ring takes 2(N − 1) steps (N − 1 per phase) and moves 2(N − 1)/N·S "
             "along the way: with N − 1 you get α and β twice too large."),
        Slip(_tree_us(d, 0.0, beta), "every tree step also pays its α: 8 steps of α + S·β."),
        Slip(_tree_us(d, alpha, 0.0), "every tree step moves the whole MiB: add S·β to each α."),
        Slip(predict("ring", d.world_size, d.nbytes, alpha, beta) * 1e6,
             "that is the ring's time for 1 MiB on these ranks; the question asks the tree's."),
        Slip(_tree_us(d, alpha, t2 / (share * s2)), "the 64 MiB time holds the ring's 2(N − 1) "
             "latencies too: take them off before you divide by the bytes."),
        Slip(_tree_us(d, alpha, (t2 - t1) / (2 * s2)), "the ring moves 2(N − 1)/N·S along the "
             "way, not 2·S: divide by 1.875·S on 16 ranks."),
    ]


check_tree_time = number(
    "05.2", "fit α and β from the ring, predict the tree", module=LESSON,
    checker="check_tree_time",
    question="A cluster's 16 ranks time only the ring all-reduce: 300 µs for 8 bytes, 6.59 ms for "
             "64 MiB. What does the α-β model predict for a **tree** all-reduce of 1 MiB on the "
             "same 16 ranks, in **µs**?",
    setup="MiB = 1 << 20\nring_8B, ring_64MiB = 300e-6, 6.59e-3   # seconds, the ring on 16 ranks",
    blanks=(Blank("my_tree_us", "µs: a number, or an expression of ring_8B, ring_64MiB, MiB",
                  "8 * (ring_8B / 30 + MiB * (ring_64MiB - ring_8B) / (1.875 * 64 * MiB)) * 1e6"),),
    inputs={"world_size": 16, "ring_times": RING_TIMES, "nbytes": 1 << 20}, unit="µs",
    answer=_tree_answer, slips=_tree_slips,
    otherwise=lambda d, name, got: (
        f"off by a factor {got / _tree_answer(d):.2f}: first solve the ring's two times for α and "
        f"β (each is 2(N − 1)·α + 2(N − 1)/N·S·β), then price the tree, 2⌈log2 N⌉·(α + S·β)."),
    success=lambda d: _tree_success(d),
    hints=("Only the ring was timed, so find the cluster first: each ring time on N = 16 ranks is "
           "2(N − 1)·α + 2(N − 1)/N·S·β. Two measured times, two unknowns.",
           "At 8 bytes the β term is negligible, so the small time alone gives α. Take the "
           "ring's α part off the 64 MiB time; what is left is the bytes along the way, "
           "2(N − 1)/N·S, times β.",
           "Then price the tree with the same α and β: two phases (reduce, broadcast) of "
           "⌈log2 N⌉ steps each, and every step moves the whole 1 MiB buffer. Answer in µs."),
    solution="""Fit the model to the two ring times, then price the tree with it. On N = 16 ranks:
    ring: 2·(16 − 1)·α + 2·(16 − 1)/16·S·β = 30α + 1.875·S·β
    8 bytes:  30α ≈ 300 µs                           →  α = 10 µs
    64 MiB:   1.875 · 67,108,864 · β = 6.59 − 0.30 ms  →  β = 5.0e-11 s/byte (1/β = 20 GB/s)
    tree, 1 MiB: 2·⌈log2 16⌉·(α + S·β) = 8 · (10 µs + 52.4 µs) ≈ 499 µs
Fitting α and β on one algorithm and pricing another with them is what the fitted column of this
lesson did: bench.fit times ring-like steps.""")


def _tree_success(d) -> str:
    alpha, beta = _fit_ring(d)
    return (f"{_tree_answer(d):,.0f} µs: the ring's two times give α = {alpha * 1e6:.1f} µs and "
            f"1/β = {1 / beta / 1e9:.1f} GB/s, and the tree pays "
            f"{2 * (d.world_size - 1).bit_length()} steps of α + S·β. Fit on one "
            f"algorithm, predict another: what the fitted column did.")
