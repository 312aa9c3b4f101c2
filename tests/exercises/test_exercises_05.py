"""Lesson 05's checkers: a right answer passes, typical wrong ones fail with a specific hint."""

from __future__ import annotations

import pytest

from allreduce_edu.costmodel import predict
from allreduce_edu.exercises import reference, registry
from allreduce_edu.exercises.lesson05 import (
    CANDIDATES,
    check_choose,
    check_crossover,
    check_float_order_answer,
    crossover,
    measured_crossover,
    solution,
)

ALPHA, BETA = 10e-6, 1 / 20e9


def right(nbytes, world_size, alpha, beta):
    return min(CANDIDATES, key=lambda algorithm: predict(algorithm, world_size, nbytes, alpha, beta))


def always_ring(nbytes, world_size, alpha, beta):
    return "ring"


def fixed_threshold(nbytes, world_size, alpha, beta):
    return "recursive_doubling" if nbytes < 64 << 10 else "rabenseifner"


def misspelled(nbytes, world_size, alpha, beta):
    return "Ring"


def choose(nbytes, world_size, alpha, beta):
    """The scaffold as the lesson ships it."""
    ...  # your code here, in place of `...`


def test_choose_checker():
    assert check_choose(right)
    assert check_choose(reference("05.1"))  # the solution runs with `predict` given to it
    assert "at 8 bytes on 2 ranks" in check_choose(always_ring).message
    assert "count the steps" in check_choose(always_ring).message
    feedback = check_choose(fixed_threshold)
    assert not feedback and "you chose" in feedback.message and "fixed threshold" in feedback.message, feedback
    assert "return one of" in check_choose(misspelled).message
    assert "raised ZeroDivisionError" in check_choose(lambda *args: 1 / 0).message


def test_crossover_is_where_the_lines_meet():
    size = crossover("tree", "ring", 8, ALPHA, BETA)
    assert size == pytest.approx(8 * ALPHA / (4.25 * BETA))
    assert predict("tree", 8, size, ALPHA, BETA) == pytest.approx(predict("ring", 8, size, ALPHA, BETA))
    assert crossover("ring", "rabenseifner", 2, ALPHA, BETA) is None  # identical lines never cross


@pytest.mark.parametrize("answer, hint", [(376_470 / 1024, "KiB"), (ALPHA / BETA, "α/β"),
                                          (-5, "positive"), ("376470", "answer with a number"), (3 * 376_470, "factor"),
                                          (11 * ALPHA / (1.25 * BETA), "two phases")])
def test_crossover_prediction(answer, hint):
    assert check_crossover(376_470.6, ALPHA, BETA, 8)
    feedback = check_crossover(answer, ALPHA, BETA, 8)
    assert not feedback and hint in feedback.message, feedback


def test_measured_crossover():
    rows = [{"algorithm": a, "bytes": s, "time_us": t} for a, s, t in [
        ("tree", 8, 1), ("ring", 8, 3), ("tree", 1024, 2), ("ring", 1024, 1), ("tree", 4096, 9), ("ring", 4096, 4)]]
    assert measured_crossover(rows) == (8, 1024)
    assert measured_crossover(rows, "ring", "tree") is None


def test_float_order_answer(capsys):
    assert check_float_order_answer("d")
    assert "integer addition (without overflow) is exact" in check_float_order_answer("a").message
    assert "grouping does not matter" in check_float_order_answer("b").message
    assert "two's complement" in check_float_order_answer("c").message
    assert "'a', 'b', 'c' or 'd'" in check_float_order_answer("x").message
    solution("05.2")
    assert "8α / (4.25β)" in capsys.readouterr().out


def test_the_scaffolds_are_not_attempts():
    for feedback, exercise in ((check_choose(choose), "05.1"),
                               (check_crossover(None, ALPHA, BETA, world_size=8), "05.2"),
                               (check_float_order_answer("?"), "05.3")):
        assert not feedback and not feedback.attempted, feedback
        assert f'hint("{exercise}")' in feedback.message


@pytest.mark.parametrize("exercise", ["05.1", "05.2", "05.3"])
def test_the_key_cells_pass(exercise):
    *body, last = registry.get(exercise).key.splitlines()
    namespace = {"predict": predict}  # the lesson imports it near its top
    exec("\n".join([*body, f"result = {last}"]), namespace)  # noqa: S102 - our own key
    assert namespace["result"], namespace["result"]


def test_interpolated_crossover_lies_where_the_measured_lines_cross():
    from allreduce_edu.exercises.lesson05 import interpolated_crossover

    rows = [{"algorithm": a, "bytes": s, "time_us": t} for a, s, t in [
        ("tree", 8, 1), ("ring", 8, 3), ("tree", 1024, 2), ("ring", 1024, 3), ("tree", 2048, 6),
        ("ring", 2048, 4)]]
    assert interpolated_crossover(rows) == pytest.approx(1024 + 1024 * 1 / 3)  # lead -1, then +2
    assert interpolated_crossover(rows, "ring", "tree") is None
    faster = [dict(r, time_us=9) if r["algorithm"] == "tree" else r for r in rows]
    assert interpolated_crossover(faster) == 8  # the ring is faster everywhere
