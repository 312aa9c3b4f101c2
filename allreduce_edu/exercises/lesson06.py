"""Lesson 06 · Numba kernels: a stable variance, the memory-bandwidth ceiling, and why nogil lets kernels overlap.

`check_variance` runs your `my_variance(row)` on rows with and without a large common offset, in float32 and
float64, and compares with NumPy's two-pass variance in float64.
"""

from __future__ import annotations

import math
import statistics
import timeit

import numpy as np

from .feedback import Feedback, failed, multiple_choice, passed  # noqa: F401
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - for the notebook

SOLUTIONS: dict[str, str] = {}  # TODO(issue 10): move into @exercise registrations

SOLUTIONS["06.1"] = """Two passes: first the mean, then the mean of the squared distances from it. The distances are small,
so nothing large cancels:
def my_variance(row):
    mean = row.sum(dtype=np.float64) / len(row)
    return float(((row - mean) ** 2).sum(dtype=np.float64) / len(row))
Or Welford's one pass (the running mean and the running sum of squared distances, updated per element):
def my_variance(row):
    mean, m2 = 0.0, 0.0
    for k, v in enumerate(row, start=1):
        d = v - mean
        mean += d / k
        m2 += d * (v - mean)
    return m2 / len(row)"""

SOLUTIONS["06.2"] = """LayerNorm must read x once and write y once: 2 · rows · hidden · 4 bytes for float32. At best it moves
them as fast as a copy does:
    seconds = 2 * 8192 * 4096 * 4 / (copy_gbps * 1e9)
(268 MB; at 20 GB/s that is 13.4 ms). So the kernel's GB/s can at best equal the copy's."""

SOLUTIONS["06.3"] = """a: nogil=True makes Numba release the GIL while the compiled kernel runs. gRPC's threads in a rank
hand every arriving frame to the mailbox in Python code, which needs the GIL: with it free, they keep receiving
on the other core while the kernel reduces. A kernel that holds the GIL freezes every Python thread of its
process until it returns."""


def variance_rows() -> list[tuple[str, np.ndarray]]:
    """The checker's rows: (description, row); deterministic."""
    rng = np.random.default_rng(6)
    return [
        ("a float32 row with mean 0 (100 values)", rng.standard_normal(100).astype(np.float32)),
        ("a float32 row of 1e3 + unit noise (4096 values)", (1e3 + rng.standard_normal(4096)).astype(np.float32)),
        ("a float32 row of 1e4 + noise (777 values)", (1e4 + 0.5 * rng.standard_normal(777)).astype(np.float32)),
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
    """Within 1e-3 of want, relative; for want == 0 (a constant row), within rounding of the row's scale."""
    return abs(got - want) <= (1e-3 * abs(want) if want else 1e-9 * scale)


def check_variance(fn) -> Feedback:
    """Exercise 06.1: `fn(row)` -> the population variance of a 1-D row, accurate with a large common offset."""
    results = []
    for what, row in variance_rows():
        try:
            got = fn(row.copy())
        except Exception as e:  # noqa: BLE001 - the learner's code: report, don't crash
            return failed(f"on {what}, your function raised {type(e).__name__}: {e}")
        value = _value(got)
        if value is None:
            return failed(f"on {what}, your function returned {type(got).__name__} {np.shape(got)}: return one "
                          f"number, the variance of the whole row.")
        results.append((what, row, value))
    for what, row, got in results:  # the centred row comes first: a wrong formula shows there
        x = row.astype(np.float64)
        want = float(np.var(x))
        scale = float(np.mean(x) ** 2) + 1.0
        if _close(got, want, scale):
            continue
        n = len(row)
        if math.isfinite(got) and _close(got * got, want, scale) and want > 0:
            return failed(f"on {what} you returned {got:.6g}, whose square is the variance {want:.6g}: you returned "
                          f"the standard deviation. Drop the square root.")
        if n > 1 and _close(got, want * n / (n - 1), scale) and want > 0:
            return failed(f"on {what} you returned {got:.6g} = the sample variance (divided by n − 1); LayerNorm "
                          f"uses the population variance: divide by n = {n}.")
        if _close(got, float(np.mean(x * x)), scale):
            return failed(f"on {what} you returned {got:.6g} = E[x²], the mean of the squares; the variance is the "
                          f"mean of the squared distances from the mean, E[(x − mean)²] = {want:.6g}.")
        if "mean 0" in what:
            return failed(f"on {what} your variance is {got:.6g} but should be {want:.6g}: check the formula on "
                          f"centred data first.")
        if row.dtype == np.float64:
            f32 = float(np.var(row.astype(np.float32).astype(np.float64)))
            if abs(got - f32) <= 1e-3 * max(abs(f32), 1e-3):
                return failed(f"on {what} you returned {got:.6g}, the variance of the row rounded to float32 "
                              f"(1e9 + noise rounds to multiples of 64): keep the row's own dtype.")
            return failed(f"on {what} your variance is {got:.6g} but should be {want:.6g}, though float32 rows "
                          f"with offsets passed. It looks like E[x²] − E[x]² in float64: float64 only moves the "
                          f"offset where the cancellation bites (here E[x²] ≈ 1e18, where float64 is spaced "
                          f"{np.spacing(1e18):.0f} apart). Subtract the mean first (two passes) or use Welford.")
        error = abs(got - want) / want if want else abs(got)
        return failed(f"on {what} your variance is {got:.6g} but should be {want:.6g} (relative error {error:.1e}), "
                      f"though it is right on a row with mean 0. That is the cancellation in E[x²] − E[x]²: two "
                      f"numbers near {np.mean(x * x):.3g} are subtracted, and their rounding errors (float32 spacing "
                      f"there is {np.spacing(np.float32(np.mean(x * x))):.3g}) swamp the true variance. Subtract the "
                      f"mean first (two passes), or use Welford's update.")
    return passed("your variance is within 1e-3 of float64's on centred rows, on float32 rows with offsets 1e3 and "
                  "1e4, on a constant row and on float64 with offset 1e9: it never subtracts two huge numbers.")


def check_ceiling(seconds, copy_gbps: float, rows: int = 8192, hidden: int = 4096, itemsize: int = 4) -> Feedback:
    """Exercise 06.2: the least time LayerNorm of a (rows, hidden) array can take, given a copy's GB/s."""
    try:
        seconds = float(seconds)
    except (TypeError, ValueError):
        return failed("answer with a number of seconds.")
    if not math.isfinite(seconds) or seconds <= 0:
        return failed("a time must be a positive number of seconds.")
    nbytes = rows * hidden * itemsize
    bw = copy_gbps * 1e9
    expected = 2 * nbytes / bw
    ratio = seconds / expected
    if abs(ratio - 1) <= 0.03:
        return passed(f"{seconds * 1e3:.2f} ms: read x once and write y once, 2 × {nbytes} bytes at "
                      f"{copy_gbps:.1f} GB/s. No LayerNorm can beat that, so its GB/s (bytes read + written / time) "
                      f"is at most the copy's, {copy_gbps:.1f} GB/s.")
    hints = [
        (0.5, "that moves x only once: LayerNorm also writes its output, another rows × hidden × 4 bytes."),
        (2.0, ("that counts x read twice (or more) plus the write: a good kernel keeps each row in cache while it "
               "computes the mean and the variance, so x leaves memory only once — read once, write once.")),
        (1.5, ("that counts three arrays moved: that is add_layernorm (acc and incoming read, one written). Plain "
               "LayerNorm reads x once and writes y once.")),
        (1e3, "that looks like milliseconds: the checker wants seconds."),
        (1e6, "that looks like microseconds: the checker wants seconds."),
        (8.0, "that counts bits: GB/s is gigabytes per second, so use bytes (4 per float32)."),
        (1 / 8, "that counts bits: GB/s is gigabytes per second, so use bytes (4 per float32)."),
        (1 / itemsize, "that counts elements, not bytes: each float32 is 4 bytes."),
        (2 ** 30 / 1e9, "GB/s means 10^9 bytes per second here, not GiB (2^30)."),
        (1e9 / 2 ** 30, "GB/s means 10^9 bytes per second here, not GiB (2^30)."),
    ]
    for factor, hint in hints:
        if abs(ratio / factor - 1) <= 0.03:
            return failed(hint)
    return failed(f"you are off by a factor {ratio:.2f}: count the bytes LayerNorm must move at least "
                  f"(rows × hidden × 4 bytes each way) and divide by the copy's bytes per second.")


def check_nogil_answer(choice: str) -> Feedback:
    """Exercise 06.3: why can a Numba kernel with nogil=True overlap with a rank's gRPC threads? (a, b, c or d)"""
    answers = {
        "a": "",
        "b": "no: Numba runs the kernel in the calling thread of the same process, on the same memory (nothing is "
             "copied). The question is what that thread holds while it runs.",
        "c": "not quite: gRPC's C core runs without the GIL, but each arriving frame is handed to the rank's mailbox "
             "by Python code, which needs the GIL. Remember experiment 1: beside the GIL-holding kernel, the Python work waited for the whole kernel.",
        "d": "no: there is no GPU here; Numba compiles for the CPU, and the kernel runs in the calling thread.",
    }
    success = ("nogil=True releases the GIL for as long as the compiled code runs, so the rank's gRPC threads "
               "(Python code that moves frames into the mailbox) keep running on the other core. Without it, "
               "every Python thread of the process waits until the kernel returns.")
    return multiple_choice(choice, answers, right="a", success=success)


def median_seconds(call, repeat: int = 5) -> float:
    """Median wall time of `call()` over `repeat` runs, after one warm-up run (page faults, first-call compile)."""
    call()
    return statistics.median(timeit.repeat(call, number=1, repeat=repeat))
