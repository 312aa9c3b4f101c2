"""Lesson 06 · Numba kernels: a stable variance, the memory-bandwidth ceiling, why nogil overlaps.

`check_variance` runs your `my_variance(row)` on rows with and without a large common offset, in
float32 and float64, and compares with NumPy's two-pass variance in float64. `try_variance` gives
the same verdict on any formula without counting it as your attempt at exercise 06.1.
"""

from __future__ import annotations

import math
import statistics
import timeit

import numpy as np

from .feedback import Feedback, failed, passed
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - notebook
from .spec import REQUIRED, Blank, Slip, choice, number


def variance_rows() -> list[tuple[str, np.ndarray]]:
    """The checker's rows: (description, row); deterministic."""
    rng = np.random.default_rng(6)
    return [
        ("a float32 row with mean 0 (100 values)", rng.standard_normal(100).astype(np.float32)),
        ("a float32 row of 1e3 + unit noise (4096 values)",
         (1e3 + rng.standard_normal(4096)).astype(np.float32)),
        ("a float32 row of 1e4 + noise (777 values)",
         (1e4 + 0.5 * rng.standard_normal(777)).astype(np.float32)),
        ("a float32 row of equal values (10 values)", np.full(10, 5.0, np.float32)),
        ("a float64 row of 1e9 + unit noise (1000 values)", 1e9 + rng.standard_normal(1000)),
    ]


def _value(result):
    """The learner's result as a float, or None if it is not one number."""
    try:
        a = np.asarray(result, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return float(a) if a.size == 1 else None


def _close(got: float, want: float, scale: float) -> bool:
    """Within 1e-3 of want, relative; for want == 0 (a constant row), within rounding of scale."""
    return abs(got - want) <= (1e-3 * abs(want) if want else 1e-9 * scale)


def try_variance(fn) -> Feedback:
    """What check_variance says about `fn(row)`, without recording an attempt at exercise 06.1."""
    results = []
    for what, row in variance_rows():
        try:
            got = fn(row.copy())
        except Exception as e:  # noqa: BLE001 - the learner's code: report, don't crash
            return failed(f"on {what}, your function raised {type(e).__name__}: {e}")
        value = _value(got)
        if value is None:
            return failed(f"on {what}, your function returned {type(got).__name__} "
                          f"{np.shape(got)}: return one number, the variance of the whole row.")
        results.append((what, row, value))
    for what, row, got in results:  # the centred row comes first: a wrong formula shows there
        problem = _variance_problem(what, row, got)
        if problem:
            return failed(problem)
    return passed("your variance is within 1e-3 of float64's on centred rows, on float32 rows with "
                  "offsets 1e3 and 1e4, on a constant row and on float64 with offset 1e9: it never "
                  "subtracts two huge numbers.")


def _variance_problem(what: str, row: np.ndarray, got: float) -> str | None:
    """What is wrong with `got` as the variance of `row`, or None when it is close enough."""
    x = row.astype(np.float64)
    want = float(np.var(x))
    scale = float(np.mean(x) ** 2) + 1.0
    if _close(got, want, scale):
        return None
    n = len(row)
    if math.isfinite(got) and _close(got * got, want, scale) and want > 0:
        return (f"on {what} you returned {got:.6g}, whose square is the variance {want:.6g}: you "
                f"returned the standard deviation. Drop the square root.")
    if n > 1 and _close(got, want * n / (n - 1), scale) and want > 0:
        return (f"on {what} you returned {got:.6g} = the sample variance (divided by n − 1); "
                f"LayerNorm uses the population variance: divide by n = {n}.")
    if _close(got, float(np.mean(x * x)), scale):
        return (f"on {what} you returned {got:.6g} = E[x²], the mean of the squares; the variance "
                f"is the mean of the squared distances from the mean, E[(x − mean)²] = "
                f"{want:.6g}.")
    if "mean 0" in what:
        return (f"on {what} your variance is {got:.6g} but should be {want:.6g}: check the "
                f"formula on centred data first.")
    if row.dtype == np.float64:
        f32 = float(np.var(row.astype(np.float32).astype(np.float64)))
        if abs(got - f32) <= 1e-3 * max(abs(f32), 1e-3):
            return (f"on {what} you returned {got:.6g}, the variance of the row rounded to float32 "
                    f"(1e9 + noise rounds to multiples of 64): keep the row's own dtype.")
        return (f"on {what} your variance is {got:.6g} but should be {want:.6g}, though float32 "
                f"rows with offsets passed. It looks like E[x²] − E[x]² in float64: float64 only "
                f"moves the offset where the cancellation bites (here E[x²] ≈ 1e18, where float64 "
                f"is spaced {np.spacing(1e18):.0f} apart). Subtract the mean first (two passes) or "
                f"use Welford.")
    error = abs(got - want) / want if want else abs(got)
    spacing = np.spacing(np.float32(np.mean(x * x)))
    return (f"on {what} your variance is {got:.6g} but should be {want:.6g} (relative error "
            f"{error:.1e}), though it is right on a row with mean 0. That is the cancellation in "
            f"E[x²] − E[x]²: two numbers near {np.mean(x * x):.3g} are subtracted, and their "
            f"rounding errors (float32 spacing there is {spacing:.3g}) swamp the true variance. "
            f"Subtract the mean first (two passes), or use Welford's update.")


@exercise("06.1", kind="code", function="my_variance",
          library=("kernels.cpu:_sum_norm_rows", "kernels.reference:layernorm_reference"))
def check_variance(fn) -> Feedback:
    """Exercise 06.1: `fn(row)` -> the population variance of a 1-D row, even with an offset."""
    return try_variance(fn)


number("06.2", module=__name__, verb="predict the ceiling",
       blanks=(Blank("my_seconds", key="8192 * 4096 * (2 + 4) / (copy_gbps * 1e9)"),),
       inputs={"copy_gbps": REQUIRED, "rows": 8192, "hidden": 4096, "read_bytes": 2,
            "write_bytes": 4},
       call="copy_gbps", unit="seconds", answer=lambda d: _ceiling(d),
       slips=lambda d: [Slip(_ceiling(d) * factor, why) for factor, why in _ceiling_slips(d)],
       otherwise=lambda d, name, got: (
        f"you are off by a factor {got / _ceiling(d):.2f}: count the bytes LayerNorm must move at "
        f"least (each element read once, at 2 bytes, and written once, at 4) and divide by the "
        f"copy's bytes per second."),
       values=lambda d: {"ms": _ceiling(d) * 1e3,
                         "moved": d.rows * d.hidden * (d.read_bytes + d.write_bytes)})


def _ceiling(d) -> float:
    return d.rows * d.hidden * (d.read_bytes + d.write_bytes) / (d.copy_gbps * 1e9)


def _ceiling_slips(d) -> list[tuple[float, str]]:
    """(answer / right answer, what it suggests) for the usual slips in exercise 06.2."""
    per = d.read_bytes + d.write_bytes
    bits = "that counts bits: GB/s is gigabytes per second, so use bytes."
    gib = "GB/s means 10^9 bytes per second here, not GiB (2^30)."
    return [
        (8 / per, "that counts 4 bytes each way: x is float16 here, 2 bytes an element."),
        (4 / per, "that counts 2 bytes each way: y is written in float32, 4 bytes an element."),
        (d.read_bytes / per, "that moves x only once: LayerNorm also writes its output y."),
        ((2 * d.read_bytes + d.write_bytes) / per, "that reads x twice: a good kernel keeps each "
         "row in cache while it computes the mean and the variance, so x leaves memory once."),
        (1e3, "that looks like milliseconds: the checker wants seconds."),
        (1e6, "that looks like microseconds: the checker wants seconds."),
        (8.0, bits), (1 / 8, bits),
        (2 ** 30 / 1e9, gib), (1e9 / 2 ** 30, gib),
    ]


choice("06.3", module=__name__)


def median_seconds(call, repeat: int = 5) -> float:
    """Median wall time of `call()` over `repeat` runs, after a warm-up (page faults, compile)."""
    call()
    return statistics.median(timeit.repeat(call, number=1, repeat=repeat))
