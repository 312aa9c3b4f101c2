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
from .texts import message


def variance_rows() -> list[tuple[str, np.ndarray]]:
    """The checker's rows: (description, row); deterministic."""
    rng = np.random.default_rng(6)
    return [
        ("a float32 row with mean 0 (100 values)", rng.standard_normal(100).astype(np.float32)),
        (message(__name__, "06.1", "float32-row-1e3"),
         (1e3 + rng.standard_normal(4096)).astype(np.float32)),
        (message(__name__, "06.1", "float32-row-1e4"),
         (1e4 + 0.5 * rng.standard_normal(777)).astype(np.float32)),
        (message(__name__, "06.1", "float32-row-equal"), np.full(10, 5.0, np.float32)),
        (message(__name__, "06.1", "float64-row-1e9"), 1e9 + rng.standard_normal(1000)),
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
            return failed(message(__name__, "06.1", "on-function-returned", what=what,
                                  name=type(got).__name__,
                                  shape=np.shape(got)))
        results.append((what, row, value))
    for what, row, got in results:  # the centred row comes first: a wrong formula shows there
        problem = _variance_problem(what, row, got)
        if problem:
            return failed(problem)
    return passed(message(__name__, "06.1", "variance-within-1e"))


def _variance_problem(what: str, row: np.ndarray, got: float) -> str | None:
    """What is wrong with `got` as the variance of `row`, or None when it is close enough."""
    x = row.astype(np.float64)
    want = float(np.var(x))
    scale = float(np.mean(x) ** 2) + 1.0
    if _close(got, want, scale):
        return None
    n = len(row)
    if math.isfinite(got) and _close(got * got, want, scale) and want > 0:
        return (message(__name__, "06.1", "on-returned-got", what=what, got=got, want=want))
    if n > 1 and _close(got, want * n / (n - 1), scale) and want > 0:
        return (message(__name__, "06.1", "sample-variance", what=what, got=got, n=n))
    if _close(got, float(np.mean(x * x)), scale):
        return (message(__name__, "06.1", "mean-of-squares", what=what, got=got, want=want))
    if "mean 0" in what:
        return (message(__name__, "06.1", "wrong-variance", what=what, got=got, want=want))
    if row.dtype == np.float64:
        f32 = float(np.var(row.astype(np.float32).astype(np.float64)))
        if abs(got - f32) <= 1e-3 * max(abs(f32), 1e-3):
            return (message(__name__, "06.1", "rounded-float32", what=what, got=got))
        return (message(__name__, "06.1", "wrong-variance-close", what=what, got=got, want=want,
                        spacing=np.spacing(1e18)))
    error = abs(got - want) / want if want else abs(got)
    spacing = np.spacing(np.float32(np.mean(x * x)))
    return (message(__name__, "06.1", "on-variance-got", what=what, got=got, want=want,
                    error=error, mean=np.mean(x * x), spacing=spacing))


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
        message(__name__, "06.2", "off-by", factor=got / _ceiling(d))),
       values=lambda d: {"ms": _ceiling(d) * 1e3,
                         "moved": d.rows * d.hidden * (d.read_bytes + d.write_bytes)})


def _ceiling(d) -> float:
    return d.rows * d.hidden * (d.read_bytes + d.write_bytes) / (d.copy_gbps * 1e9)


def _ceiling_slips(d) -> list[tuple[float, str]]:
    """(answer / right answer, what it suggests) for the usual slips in exercise 06.2."""
    per = d.read_bytes + d.write_bytes
    bits = message(__name__, "06.2", "counts-bits-gb")
    gib = message(__name__, "06.2", "gb-means-10")
    return [
        (8 / per, message(__name__, "06.2", "counts-4-bytes")),
        (4 / per, message(__name__, "06.2", "counts-2-bytes")),
        (d.read_bytes / per, message(__name__, "06.2", "moves-x-only")),
        ((2 * d.read_bytes + d.write_bytes) / per, message(__name__, "06.2", "reads-x-twice")),
        (1e3, message(__name__, "06.2", "looks-like-milliseconds")),
        (1e6, message(__name__, "06.2", "looks-like-microseconds")),
        (8.0, bits), (1 / 8, bits),
        (2 ** 30 / 1e9, gib), (1e9 / 2 ** 30, gib),
    ]


choice("06.3", module=__name__)


def median_seconds(call, repeat: int = 5) -> float:
    """Median wall time of `call()` over `repeat` runs, after a warm-up (page faults, compile)."""
    call()
    return statistics.median(timeit.repeat(call, number=1, repeat=repeat))
