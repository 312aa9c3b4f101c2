"""Lesson 06's checkers: a right answer passes, typical wrong ones fail with a specific hint."""

from __future__ import annotations

import numpy as np
import pytest

from allreduce_edu.exercises import reference, registry
from allreduce_edu.exercises.lesson06 import (
    check_ceiling,
    check_nogil_answer,
    check_variance,
    median_seconds,
    try_variance,
)


def two_pass(row):
    mean = row.sum(dtype=np.float64) / len(row)
    return float(((row - mean) ** 2).sum(dtype=np.float64) / len(row))


def two_pass_float32(row):  # stays in the row's dtype: still stable
    return (row - row.mean()) ** 2 @ np.ones(len(row), row.dtype) / len(row)


def welford(row):
    mean, m2 = 0.0, 0.0
    for k, v in enumerate(row, start=1):
        d = v - mean
        mean += d / k
        m2 += d * (v - mean)
    return m2 / len(row)


def one_pass_float32(row):
    return np.mean(row * row) - np.mean(row) ** 2


def one_pass_loop(row):  # running float32 sums, as a plain loop keeps them
    s = q = np.float32(0)
    for v in row:
        s += v
        q += v * v
    n = len(row)
    return q / n - (s / n) ** 2


def one_pass_float64(row):
    x = row.astype(np.float64)
    return np.mean(x * x) - np.mean(x) ** 2


@pytest.mark.parametrize("fn", [two_pass, two_pass_float32, welford, np.var])
def test_stable_variances_pass(fn):
    feedback = check_variance(fn)
    assert feedback, feedback


@pytest.mark.parametrize("fn, words", [
    (one_pass_float32, ["E[x²] − E[x]²", "1e3 + unit noise", "right on a row with mean 0", "two passes"]),
    (one_pass_loop, ["E[x²] − E[x]²", "cancellation"]),
    (one_pass_float64, ["1e9", "float64 only moves the offset", "Welford"]),
    (np.std, ["standard deviation", "square root"]),
    (lambda row: np.var(row, ddof=1), ["sample variance", "divide by n = 100"]),
    (lambda row: np.mean(row.astype(np.float64) ** 2), ["E[x²], the mean of the squares"]),
    (lambda row: np.var(row.astype(np.float32).astype(np.float64)), ["rounded to float32", "own dtype"]),
    (lambda row: (row - row.mean()) ** 2, ["return one number"]),
    (lambda row: row.variance(), ["raised AttributeError"]),
])
def test_wrong_variances_get_specific_hints(fn, words):
    feedback = check_variance(fn)
    assert not feedback
    for word in words:
        assert word in feedback.message, feedback


@pytest.mark.parametrize("factor, hint", [(8 / 6, "4 bytes each way"), (4 / 6, "2 bytes each way"),
                                          (2 / 6, "moves x only once"),
                                          (1e3, "milliseconds"), (1e6, "microseconds"), (8.0, "bits"),
                                          (2 ** 30 / 1e9, "GiB"), (3.3, "factor 3.30")])
def test_ceiling(factor, hint):
    right = 8192 * 4096 * (2 + 4) / 20e9  # x read in float16, y written in float32
    assert check_ceiling(right, 20.0)
    assert check_ceiling(right * 1.02, 20.0)
    feedback = check_ceiling(right * factor, 20.0)
    assert not feedback and hint in feedback.message, feedback


def test_ceiling_rejects_non_numbers():
    assert "number of seconds" in check_ceiling("fast", 20.0).message
    assert "positive" in check_ceiling(-1, 20.0).message


def test_nogil_answer():
    assert check_nogil_answer("a")
    assert "inside one Python interpreter" in check_nogil_answer("b").message
    assert "side by side" in check_nogil_answer("c").message
    assert "nothing is lost" in check_nogil_answer("d").message
    assert "'a', 'b', 'c' or 'd'" in check_nogil_answer("x").message


def test_median_seconds_runs_the_call_repeat_plus_one_times():
    calls = []
    assert median_seconds(lambda: calls.append(1), repeat=3) >= 0
    assert len(calls) == 4


def my_variance(row):
    """The scaffold as the lesson ships it."""
    ...  # your code here, in place of `...`


def test_the_variance_solutions_pass(capsys):
    assert check_variance(reference("06.1"))
    ex = registry.get("06.1")
    welford = ex.explanation[ex.explanation.index("def my_variance"):]  # the one-pass answer it also shows
    namespace = {"np": np}
    exec(welford, namespace)  # noqa: S102 - our own solution text
    assert check_variance(namespace["my_variance"])
    registry.solution("06.1")
    shown = capsys.readouterr().out
    assert "pass 1: the mean" in shown and "Welford" in shown


def test_the_scaffolds_are_not_attempts():
    for feedback, exercise in ((check_variance(my_variance), "06.1"),
                               (check_ceiling(None, 20.0), "06.2"),
                               (check_nogil_answer("?"), "06.3")):
        assert not feedback and not feedback.attempted, feedback
        assert f'hint("{exercise}")' in feedback.message


def test_try_variance_gives_the_verdict_without_recording_an_attempt(tmp_path, monkeypatch):
    monkeypatch.setenv("ALLREDUCE_EDU_DATA_DIR", str(tmp_path))
    one_pass = try_variance(one_pass_float32)
    assert not one_pass and "E[x²] − E[x]²" in one_pass.message
    assert try_variance(two_pass)
    assert not (tmp_path / "progress.json").exists()
    assert check_variance(one_pass_float32).message == one_pass.message
    assert (tmp_path / "progress.json").exists()


@pytest.mark.parametrize("exercise", ["06.2", "06.3"])
def test_the_key_cells_pass(exercise):
    *body, last = registry.get(exercise).key.splitlines()
    namespace = {"copy_gbps": 20.0}  # measured earlier in the lesson
    exec("\n".join([*body, f"result = {last}"]), namespace)  # noqa: S102 - our own key
    assert namespace["result"], namespace["result"]
