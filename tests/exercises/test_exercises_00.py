"""Lesson 00's checkers: a right answer passes, typical wrong ones fail with a specific hint."""

from __future__ import annotations

import pytest

import allreduce_edu
from allreduce_edu.exercises import (
    check_average,
    check_welcome_prediction,
    reference,
    registry,
    solution,
)
from allreduce_edu.notebook import show_source


def test_the_right_prediction_passes():
    feedback = check_welcome_prediction([60.0, 64.0, 68.0, 72.0])
    assert feedback and repr(feedback).startswith("✓")


@pytest.mark.parametrize("answer, hint", [([4.0] * 4, "number of ranks"), ([15.0, 16.0, 17.0, 18.0], "average"),
                                          ([60.0, 64.0, 68.0], "shape"), (60, "shape"),
                                          ([61.0, 64.0, 68.0, 72.0], "is not it: add up"),
                                          ("sixty", "list of 4 numbers"),
                                          ([10.0] * 4, "first_allreduce"),  # lesson 00's own run, another input
                                          ([6.0, 46.0, 86.0, 126.0], "each rank's own 4 elements"),
                                          ([264.0] * 4, "keeps the 4 elements apart"),
                                          ([30.0, 31.0, 32.0, 33.0], "one rank's own input")])
def test_wrong_predictions_get_a_specific_hint(answer, hint):
    feedback = check_welcome_prediction(answer)
    assert not feedback and hint in feedback.message and repr(feedback).startswith("✗")


def test_the_prediction_scaffold_is_not_an_attempt():
    feedback = check_welcome_prediction(None)
    assert not feedback and not feedback.attempted and repr(feedback).startswith("○")
    assert 'hint("00.1")' in feedback.message


def right(comm, grad):
    return allreduce_edu.allreduce(comm, grad, op="sum") / comm.world_size


def summed(comm, grad):
    return allreduce_edu.allreduce(comm, grad)


def own(comm, grad):
    return grad.copy()


def forgot_return(comm, grad):
    allreduce_edu.allreduce(comm, grad, op="sum")


def crashes(comm, grad):
    raise RuntimeError("oops")


def wrong_divisor(comm, grad):
    return allreduce_edu.allreduce(comm, grad) / (comm.world_size + 1)


def in_place(comm, grad):
    grad[:] = allreduce_edu.allreduce(comm, grad) / comm.world_size
    return grad


def my_average(comm, grad):
    """The scaffold as the lesson ships it."""
    ...  # your code here, in place of `...`


@pytest.mark.processes
def test_average_checker():
    assert check_average(right)
    assert "divides, by the number of ranks" in check_average(summed).message
    assert "returned its own gradient" in check_average(own).message
    assert "returned None" in check_average(forgot_return).message
    assert "RuntimeError on rank" in check_average(crashes).message
    assert "oops" in check_average(crashes).message
    assert "expected the average" in check_average(wrong_divisor).message
    assert "changed grad in place" in check_average(in_place).message


def test_average_scaffold_is_not_an_attempt():
    feedback = check_average(my_average)
    assert not feedback and not feedback.attempted and "my_average" in feedback.message
    assert 'hint("00.2")' in feedback.message


@pytest.mark.processes
def test_the_reference_solution_passes():
    fn = reference("00.2")
    assert fn.__name__ == "my_average" and check_average(fn)


def test_solutions_are_one_call_away(capsys):
    solution("00.2")
    assert "/ comm.world_size" in capsys.readouterr().out
    solution("00.1")
    assert "[60., 64., 68., 72.]" in capsys.readouterr().out
    with pytest.raises(KeyError, match="00.1"):
        solution("99.9")


def test_registered_with_hints():
    assert registry.get("00.1").kind == "number" and len(registry.get("00.1").hints) >= 1
    assert registry.get("00.2").kind == "code" and len(registry.get("00.2").hints) >= 2
    assert "def my_average(" in registry.get("00.2").key


def test_show_source_shows_the_library_code():
    source = show_source(allreduce_edu.collectives.ring.reduce_scatter_ring)
    assert repr(source).startswith("# allreduce_edu/collectives/ring.py\n")
    assert "def reduce_scatter_ring" in repr(source) and "<span" in source._repr_html_()


def test_a_long_listing_shows_folded_a_short_one_open():
    from allreduce_edu.notebook import FOLD_LINES
    long = show_source(allreduce_edu.collectives.ring.reduce_scatter_ring_into)
    assert long.code.count("\n") + 1 > FOLD_LINES
    assert long._repr_html_().startswith("<details") and "lines: click to show" in long._repr_html_()
    short = show_source(allreduce_edu.collectives.registry.reduce_into)
    assert short.code.count("\n") + 1 <= FOLD_LINES and "<details" not in short._repr_html_()
