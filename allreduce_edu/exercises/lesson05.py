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
from .registry import exercise, hint, is_stub, learner_or_reference, solution  # noqa: F401 - notebook
from .spec import Blank, Slip, choice, number
from .texts import message

#: the algorithms lesson 05 chooses among (lesson 04's four)
CANDIDATES = ("ring", "tree", "recursive_doubling", "rabenseifner")


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
        parts.append(message(__name__, "05.1", "not-power-of-two", n=n, p=p))
    return "; ".join(parts) or message(__name__, "05.1", "compare-formula-with")


def _check_formulas(my_time) -> Feedback | None:
    """The first (algorithm, N, S) where my_time disagrees with the model (None: nowhere)."""
    if _uses_the_model(my_time):
        return failed(message(__name__, "05.1", "my-time-asks"))
    alpha, beta = LAPTOP
    for n in range(2, 513):
        for algorithm in CANDIDATES:
            for s in FORMULA_SIZES:
                call = f"my_time({algorithm!r}, {n}, {s}, {alpha:g}, {beta:g})"
                try:
                    got = my_time(algorithm, n, s, alpha, beta)
                    if got is None:
                        return failed(message(__name__, "05.1", "call-returned-none", call=call,
                                              listed=', '.join(CANDIDATES)))
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
                return failed(message(__name__, "05.1", "algorithm-on-n", algorithm=algorithm, n=n,
                                      s=s, says=got * 1e6,
                                      model=want * 1e6, units=units,
                                      why=_why(algorithm, n, s, _terms(my_time, algorithm, n, s),
                                               model)))
    return None


@exercise("05.1", kind="code", function="choose",
          library=("model.costmodel:naive", "model.costmodel:ring", "model.costmodel:tree",
             "model.costmodel:recursive_doubling", "model.costmodel:rabenseifner",
             "model.tuner:tune"),
          args=('my_time',))
def check_choose(choose, my_time=None) -> Feedback:
    """Exercise 05.1: my_time(algorithm, world_size, nbytes, alpha, beta) is the model's formula
    for every N = 2 … 512, and choose(nbytes, world_size, alpha, beta) names the fastest."""
    if my_time is not None:
        if is_stub(my_time):
            return not_attempted(message(__name__, "05.1", "write-body-my"))
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
                why = message(__name__, "05.1", "small-messages-are")
            elif nbytes >= 1 << 24:
                why = message(__name__, "05.1", "large-messages-are")
            else:
                why = message(__name__, "05.1", "near-crossover-compare")
            return failed(message(__name__, "05.1", "at-where-chose", where=where, got=got,
                                  predicted=times[got] * 1e6, best=best,
                                  want_us=times[best] * 1e6, why=why))
    checked = message(__name__, "05.1", "formulas-agree-with") if my_time else ""
    return passed(message(__name__, "05.1", "checked-choice-matched", checked=checked))


choice("05.3", module=__name__)


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
        Slip(want / 1e6, "seconds"), Slip(want / 1e3, "milliseconds"),
        Slip(_tree_us(d, alpha, beta, phases=1), "one-phase"), Slip(2 * want, "ring-steps"),
        Slip(_tree_us(d, 0.0, beta), "no-alpha"), Slip(_tree_us(d, alpha, 0.0), "no-beta"),
        Slip(predict("ring", d.world_size, d.nbytes, alpha, beta) * 1e6, "ring-time"),
        Slip(_tree_us(d, alpha, t2 / (share * s2)), "latencies-in-beta"),
        Slip(_tree_us(d, alpha, (t2 - t1) / (2 * s2)), "two-s"),
    ]


def _tree_values(d) -> dict:
    alpha, beta = _fit_ring(d)
    return {"tree_us": _tree_answer(d), "alpha_us": alpha * 1e6, "gbps": 1 / beta / 1e9,
            "steps": 2 * (d.world_size - 1).bit_length()}


number("05.2", module=__name__,
       setup="MiB = 1 << 20\n"
             "ring_8B, ring_64MiB = 300e-6, 6.59e-3   # seconds, the ring on 16 ranks",
       blanks=(Blank("my_tree_us", key="8 * (ring_8B / 30 + MiB * (ring_64MiB - ring_8B) "
                                       "/ (1.875 * 64 * MiB)) * 1e6"),),
       inputs={"world_size": 16, "ring_times": RING_TIMES, "nbytes": 1 << 20}, unit="µs",
       answer=_tree_answer, slips=_tree_slips,
       otherwise=lambda d, name, got: message(__name__, "05.2", "off-by",
                                              factor=got / _tree_answer(d)),
       values=_tree_values)
