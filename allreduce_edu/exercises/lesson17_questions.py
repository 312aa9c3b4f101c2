"""Lesson 17's questions as data (exercises 17.2, 17.3); lesson17.py re-exports the checkers."""

from __future__ import annotations

import math

from .spec import Blank, Slip, choice, number

LESSON = "allreduce_edu.exercises.lesson17"  # where the notebook imports them from


# --- 17.2 ------------------------------------------------------------------------------------
def _matrix(d) -> tuple[int, int, int]:
    """(n, m, r): the gradient viewed as shape[0] × the rest, and PowerSGD's rank."""
    return d.shape[0], math.prod(d.shape[1:]), d.rank


def _ratio(d) -> float:
    n, m, r = _matrix(d)
    return n * m / ((n + m) * r)


def _ratio_slips(d) -> list[Slip]:
    (n, m, r), second = _matrix(d), d.shape[1]
    return [
        Slip(n * second / ((n + second) * r), f"that uses m = {second}. PowerSGD views the "
             f"gradient as shape[0] × everything else, so m = {second}·"
             f"{math.prod(d.shape[2:])} = {m}."),
        Slip(n * m / (n + m), "each factor has r columns: P is n×r and Q is m×r, so (n + m)·r "
             "values travel."),
        Slip(m / r, "that counts only P (n×r) against n·m: Q (m×r) travels too."),
        Slip(n / r, "that counts only Q (m×r): P (n×r) travels too."),
        Slip(n * m / (sum(d.shape) * r), "the matrix has two sides, n and m: every dimension "
             "after the first goes into m (their product), not into a sum of four."),
        Slip((n + m) * r / (n * m), "that is the compressed share; the ratio is before ÷ after, "
             "more than 1."),
    ]


def _ratio_success(d) -> str:
    n, m, r = _matrix(d)
    return (f"{_ratio(d):.1f}: the {d.shape} gradient is a {n}×{m} matrix, {n * m:,} values; "
            f"P and Q are ({n} + {m})·{r} = {(n + m) * r:,}. A layer this wide compresses well; "
            f"a 64×64 matrix at rank 2 only 16×.")


check_powersgd_ratio = number(
    "17.2", "predict PowerSGD's compression ratio for a conv layer", module=LESSON,
    checker="check_powersgd_ratio",
    question=None,  # the lesson asks it after PowerSGD's algorithm, in its own words
    blanks=(Blank("my_ratio", "a number, or an expression", "256 * 1152 / ((256 + 1152) * 2)"),),
    inputs={"shape": (256, 128, 3, 3), "rank": 2},
    answer=_ratio, slips=_ratio_slips, success=_ratio_success,
    otherwise=lambda d, name, got: (f"off by ×{got / _ratio(d):.3g}: view the gradient as a "
                                    f"matrix, count the values of P and Q, and divide "
                                    f"(hint(\"17.2\"))."),
    todo="replace None with the ratio (a number or an expression), then run this cell again.",
    hints=("PowerSGD compresses matrices. A gradient of more than two dimensions is viewed as "
           "a matrix first: its first dimension by all the others together (torch: "
           "view(n, -1)). What are n and m for shape (256, 128, 3, 3)?",
           "n = 256 and m = 128·3·3 = 1152. Then count what travels instead of the n·m values.",
           "The key idea: P is n×r and Q is m×r, and both travel, so (n + m)·r values replace "
           "n·m; the ratio is the values before divided by the values after."),
    solution="""View the gradient as a matrix: n = 256 rows by m = 128·3·3 = 1152 columns.
Uncompressed it is n·m = 294,912 values; PowerSGD at rank 2 sends P (n×r) and Q (m×r):
(n + m)·r = 1408·2 = 2,816 values. The ratio is 294,912 / 2,816 ≈ 104.7
(compression_ratio(256, 1152, 2)).""")


# --- 17.3 ------------------------------------------------------------------------------------
check_when_compression_pays = choice(
    "17.3", "when compression pays", module=LESSON, checker="check_when_compression_pays",
    question=None,  # the lesson asks it after the measured table, options as sentences
    options={
        "a": "Yes: it sends about 16× fewer values, and fewer bytes take less time on any link",
        "b": "Yes: a link between data centres is slow, and on a slow network compression "
             "always pays",
        "c": "No: the step is dominated by α, not by bytes, and PowerSGD pays α in three "
             "all-reduces",
        "d": "No: its matrices are too small, so PowerSGD sends more values than plain "
             "all-reduce does",
    },
    right="c",
    slips={
        "a": "count the time, not the bytes. Here plain's bytes take about 3.5 ms "
             "(2(N − 1)/N·S·β); what does the α part cost, and how often does PowerSGD pay it?",
        "b": "slow in which term? α is large here but the bytes are few: 2(N − 1)·α ≈ 420 ms "
             "against ≈ 3.5 ms of bytes. Compression shrinks only the bytes' term.",
        "d": "compression_ratio(128, 128, 4) is 16, so PowerSGD does send fewer values. The "
             "reason is what every all-reduce costs whatever its size.",
    },
    why="the step is latency-bound. On this network the plain ring takes 2(N − 1)·α = 14 · 30 ms "
        "= 420 ms of latency and only 2(N − 1)/N · 2 MB / 1 GB/s ≈ 3.5 ms of bytes. PowerSGD "
        "shrinks the 3.5 ms to almost nothing but runs three all-reduces (the uncompressed "
        "tensors, the Ps, the Qs), each paying the 420 ms: about 1.26 s against 0.42 s; fp16 "
        "would save under 2 ms. Compression pays only where the β term dominates (the slow "
        "link above); torch's hooks and DeepSpeed's 1-bit Adam are for bandwidth-bound steps.",
    hints=("Write the α-β time of one plain ring all-reduce here: 2(N − 1)·α + 2(N − 1)/N·S·β. "
           "Which of the two terms is bigger on this network?",
           "Compression shrinks S, so only the β term. How many all-reduces, each paying "
           "2(N − 1)·α, does one PowerSGD step run?",
           "The key idea: compression pays only when the bytes' time dominates the step. Where "
           "latency dominates, fewer bytes save almost nothing, and PowerSGD's three all-reduces "
           "pay the latency three times."))
