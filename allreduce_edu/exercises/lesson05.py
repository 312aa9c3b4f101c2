"""Lesson 05 · choosing an algorithm: write the cost model, fit it, explain the bits.

`check_choose` compares your `my_time(algorithm, world_size, nbytes, alpha, beta)` with the
library's formulas for every N from 2 to 512 and names the first (algorithm, N, S) where they
disagree; then it asks your `choose(nbytes, world_size, alpha, beta)` about sizes from 8 B to 1 GiB
and three machines, and names the first case where its pick is not the model's fastest.
"""

from __future__ import annotations

import numpy as np

from ..bench import combine, measure
from ..model.costmodel import crossover, predict  # noqa: F401 - lesson 10 imports crossover from here
from .feedback import Feedback, failed, not_attempted, passed
from .lesson05_questions import check_tree_time  # noqa: F401 - the notebook imports it here
from .registry import exercise, hint, is_stub, learner_or_reference, solution  # noqa: F401 - notebook
from .spec import choice

#: the algorithms lesson 05 chooses among (lesson 04's four)
CANDIDATES = ("ring", "tree", "recursive_doubling", "rabenseifner")

CHOOSE_SOLUTION = """def my_time(algorithm, world_size, nbytes, alpha, beta):
    N, S = world_size, float(nbytes)
    levels = (N - 1).bit_length()             # ⌈log2 N⌉
    p = 1 << (N.bit_length() - 1)             # the largest power of two ≤ N
    k = p.bit_length() - 1                    # log2 p
    fold = 0 if p == N else 2 * (alpha + S * beta)
    if algorithm == "ring":
        return 2 * (N - 1) * alpha + 2 * (N - 1) / N * S * beta
    if algorithm == "tree":
        return 2 * levels * (alpha + S * beta)
    if algorithm == "recursive_doubling":
        return k * (alpha + S * beta) + fold
    if algorithm == "rabenseifner":
        return 2 * k * alpha + 2 * (p - 1) / p * S * beta + fold
    raise ValueError(f"no formula for {algorithm!r}")


def choose(nbytes, world_size, alpha, beta):
    return min(["ring", "tree", "recursive_doubling", "rabenseifner"],
               key=lambda algorithm: my_time(algorithm, world_size, nbytes, alpha, beta))"""

#: the sizes (bytes) at which check_choose compares your formulas with the model's, N = 2 … 512
FORMULA_SIZES = (8, 777_777, 1 << 30)
LAPTOP = (500e-6, 1 / 1.0e9)  # lesson 01's typical laptop pair: the machine of the formula check


def measure_rows(cluster, algorithms, sizes, dtype="float32", iters=20, warmup=5,
                 budget=2.0) -> list[dict]:
    """`bench.run`'s rows without its ping-pong (slow over emulated links): time, algbw, busbw for
    each (algorithm, size)."""
    return combine(cluster.run(measure, algorithms, sizes, dtype, iters, warmup, budget))


def _grid():
    """(nbytes, world_size, alpha, beta): 8 B … 1 GiB, 2 … 512 ranks, a laptop and a cluster."""
    sizes = [8 << (2 * k) for k in range(14)] + [3000, 100_000, 777_777, 5_000_000]
    machines = [LAPTOP, (10e-6, 1 / 20e9), (2e-3, 1 / 50e6)]
    for alpha, beta in machines:
        for world_size in (2, 3, 4, 5, 8, 13, 16, 64, 512):
            for nbytes in sorted(sizes):
                yield nbytes, world_size, alpha, beta


def _describe(alpha: float, beta: float) -> str:
    return f"α = {alpha * 1e6:g} µs, 1/β = {1 / beta / 1e9:g} GB/s"


def _uses_the_model(fn) -> bool:
    """Whether `fn` is the library's cost model or calls it (predict, COSTS, costmodel)."""
    code = getattr(fn, "__code__", None)
    return (getattr(fn, "__module__", "") == predict.__module__
            or bool(code and {"predict", "COSTS", "costmodel"} & set(code.co_names)))


def _terms(fn, algorithm: str, n: int, s: float) -> tuple[float, float] | None:
    """(steps, bytes along the way) of a formula: its time with α = 1, β = 0 and α = 0, β = 1."""
    try:
        return float(fn(algorithm, n, s, 1.0, 0.0)), float(fn(algorithm, n, s, 0.0, 1.0))
    except Exception:  # noqa: BLE001 - the learner's formula may not take β = 0: no diagnosis
        return None


def _why(algorithm: str, n: int, s: float, mine, model) -> str:
    """What differs between the learner's formula and the model's at (algorithm, N, S)."""
    parts = []
    if mine is not None:
        for what, got, want, unit in (("steps (the α term)", mine[0], model[0], ""),
                                      ("bytes along the way (the β term)", mine[1] / s,
                                       model[1] / s, "·S")):
            if abs(got - want) > 1e-6 * max(abs(want), 1.0):
                parts.append(f"your {what} {got:.4g}{unit}, the table's {want:.4g}{unit}")
    p = 1 << (n.bit_length() - 1)
    if algorithm == "tree" and p != n:
        parts.append(f"the tree rounds up: ⌈log2 {n}⌉ = {(n - 1).bit_length()} levels")
    elif algorithm in ("recursive_doubling", "rabenseifner") and p != n:
        parts.append(f"{n} is not a power of two: run on p = {p} ranks and add the fold and "
                     f"unfold, 2 more steps of the whole buffer")
    return "; ".join(parts) or "compare your formula with the table's row"


def _check_formulas(my_time) -> Feedback | None:
    """The first (algorithm, N, S) where my_time disagrees with the model (None: nowhere)."""
    if _uses_the_model(my_time):
        return failed("your my_time asks the library's cost model; the exercise is to write the "
                      "four formulas yourself, from the table above.")
    alpha, beta = LAPTOP
    for n in range(2, 513):
        for algorithm in CANDIDATES:
            for s in FORMULA_SIZES:
                call = f"my_time({algorithm!r}, {n}, {s}, {alpha:g}, {beta:g})"
                try:
                    got = my_time(algorithm, n, s, alpha, beta)
                    if got is None:
                        return failed(f"{call} returned None: return seconds, a number, for "
                                      f"each of {', '.join(CANDIDATES)}.")
                    got = float(got)
                except Exception as e:  # noqa: BLE001 - the learner's code: report, don't crash
                    return failed(f"{call} raised {type(e).__name__}: {e}")
                want = predict(algorithm, n, s, alpha, beta)
                if abs(got - want) <= 1e-6 * want:
                    continue
                scale = got / want
                units = next((f" — that is {unit}: return seconds" for unit, x in
                              (("ms", 1e3), ("µs", 1e6)) if abs(scale / x - 1) < 1e-6), "")
                model = (predict(algorithm, n, s, 1.0, 0.0), predict(algorithm, n, s, 0.0, 1.0))
                return failed(f"{algorithm} on N = {n}, S = {s:,} bytes: your my_time says "
                              f"{got * 1e6:,.6g} µs, the model {want * 1e6:,.6g} µs{units}; "
                              f"{_why(algorithm, n, s, _terms(my_time, algorithm, n, s), model)}.")
    return None


@exercise(
    "05.1", "write the model's formulas, choose by them", kind="code", function="choose",
    library=("model.costmodel:naive", "model.costmodel:ring", "model.costmodel:tree",
             "model.costmodel:recursive_doubling", "model.costmodel:rabenseifner",
             "model.tuner:tune"),
    solution=CHOOSE_SOLUTION,
    hints=("Translate the lesson's table row by row: each time is the steps times α plus the "
           "bytes along the way times β, with N the world size and S the bytes (γ left out). "
           "The checker names the first term of the first row that is off.",
           "You need two integers from N: the tree's depth ⌈log2 N⌉ (rounded up), and p, the "
           "largest power of two not above N, with its log2. An int's bit_length gives both "
           "without floating point.",
           "Recursive doubling and Rabenseifner run on p ranks; when N is not a power of two the "
           "extra ranks fold in before and unfold after, two more steps that each move the whole "
           "buffer. choose prices all four names with your my_time and keeps the cheapest.",
           'The key idea: every algorithm is a straight line in S, its intercept the steps times '
           'α and its slope the bytes along the way times β; a rank count that is not a power of '
           'two costs the recursive ones a whole buffer in and out. Choosing is then picking the '
           "lowest of four prices, as NCCL's tuner does with its own model."),
    todo="write the bodies of my_time and choose in place of `...`, then run this cell again.",
    key="""from allreduce_edu.exercises.lesson05 import check_choose, hint, solution

""" + CHOOSE_SOLUTION + """

check_choose(choose, my_time)""")
def check_choose(choose, my_time=None) -> Feedback:
    """Exercise 05.1: my_time(algorithm, world_size, nbytes, alpha, beta) is the model's formula
    for every N = 2 … 512, and choose(nbytes, world_size, alpha, beta) names the fastest."""
    if my_time is not None:
        if is_stub(my_time):
            return not_attempted('write the body of my_time in place of `...` (the table\'s '
                                 'formulas), then run this cell again. Stuck? hint("05.1") gives '
                                 'a first hint.')
        wrong = _check_formulas(my_time)
        if wrong is not None:
            return wrong
    for nbytes, n, alpha, beta in _grid():
        times = {a: predict(a, n, nbytes, alpha, beta) for a in CANDIDATES}
        best = min(times, key=times.get)
        try:
            got = choose(nbytes, n, alpha, beta)
        except Exception as e:  # noqa: BLE001 - the learner's code: report, don't crash
            return failed(f"choose({nbytes}, {n}, {alpha:g}, {beta:g}) raised "
                          f"{type(e).__name__}: {e}")
        where = f"{nbytes:,} bytes on {n} ranks ({_describe(alpha, beta)})"
        if got not in times:
            return failed(f"for {where} you returned {got!r}; return one of "
                          f"{', '.join(CANDIDATES)}.")
        if times[got] > times[best] * (1 + 1e-9):
            if nbytes <= 1024:
                why = "small messages are priced by α: count the steps"
            elif nbytes >= 1 << 24:
                why = "large messages are priced by β: count the bytes along the way"
            else:
                why = "near a crossover, compare the full formulas, not a fixed threshold"
            return failed(f"at {where} you chose {got} (predicted {times[got] * 1e6:,.1f} µs) but "
                          f"{best} is predicted {times[best] * 1e6:,.1f} µs — {why}; price every "
                          f"candidate with your formulas and keep the cheapest.")
    checked = "your formulas agree with the model's on 2 to 512 ranks, and " if my_time else ""
    return passed(f"{checked}your choice matched the model's fastest algorithm at every size from "
                  "8 B to 1 GiB, for 2 to 512 ranks, on a laptop, a real cluster and a slow "
                  "emulated link.")


check_float_order_answer = choice(
    "05.3", "ring and tree on integers", module=__name__, checker="check_float_order_answer",
    question="Ring and tree all-reduce the same float32 inputs and disagree in the last bits. "
             "Run them instead on int32 token counts (no sum overflows). The two results",
    options={
        "a": "differ in the last bits: as in float32, (a + b) + c and a + (b + c) round apart.",
        "b": "agree only on 2, 4, 8, … ranks: on 6 ranks the tree's grouping is lopsided.",
        "c": "differ on some CPUs: vector units add the int32 lanes in their own order.",
        "d": "agree bit for bit: below 2^31 every int32 sum is exact, in any order.",
    },
    right="d",
    slips={
        "a": "rounding happens only when a result has more digits than its type can hold: float "
             "addition rounds, integer addition (without overflow) is exact.",
        "b": "an unbalanced tree groups the additions differently, but for integers grouping "
             "does not matter: (a + b) + c = a + (b + c) exactly, on any number of ranks.",
        "c": "the order of integer additions cannot change their sum: every CPU, vector unit or "
             "not, gives the one exact answer (two's complement); only floating point rounds.",
    },
    why="the float results differ because float addition rounds after every step, so it is not "
        "associative and the ring and the tree group the additions differently. Integer addition "
        "is exact and associative: any algorithm, any N, the same bits. Deterministic float "
        "reductions need a fixed order instead (NCCL_ALGO pinned, or fixed-point sums).",
    hints=("Why do float32 results depend on the order of the additions at all?",
           "Does integer addition ever round? Then can the grouping of the additions change the "
           "sum?"))


def measured_crossover(rows, a: str = "tree", b: str = "ring") -> tuple[int | None, int] | None:
    """From measured rows: (the size below, the first size from which `b` stays faster than `a`).

    The size below is None when `b` is faster at every measured size; the answer is None when `b`
    is not faster at the largest size (no crossover in the range)."""
    times = {(r["algorithm"], r["bytes"]): r["time_us"] for r in rows}
    sizes_of = {name: {s for (n, s) in times if n == name} for name in (a, b)}
    sizes = sorted(sizes_of[a] & sizes_of[b])
    for i, size in enumerate(sizes):
        if all(times[b, s] < times[a, s] for s in sizes[i:]):
            return (sizes[i - 1] if i > 0 else None, size)
    return None


def line_crossover(rows, a: str = "tree", b: str = "ring") -> float | None:
    """From measured rows: the size in bytes where the straight lines fitted through `a`'s and
    `b`'s times (least squares over every measured size: times are straight lines in the size)
    cross, `b` faster above it. One noisy run moves it little, where the sizes around a crossing
    would move with it. None when `b`'s line never gets below `a`'s at a positive size."""
    lines = {}
    for name in (a, b):
        points = np.array(sorted((r["bytes"], r["time_us"]) for r in rows
                                 if r["algorithm"] == name), dtype=float)
        lines[name] = np.polyfit(points[:, 0], points[:, 1], 1)  # (slope, intercept)
    (slope_a, start_a), (slope_b, start_b) = lines[a], lines[b]
    if slope_b >= slope_a:
        return None
    size = (start_b - start_a) / (slope_a - slope_b)
    return float(size) if size > 0 else None
