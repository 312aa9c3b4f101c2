"""Lesson 01's checkers: a right answer passes, typical wrong ones fail with a specific hint."""

from __future__ import annotations

import numpy as np
import pytest

from allreduce_edu.exercises import reference, registry
from allreduce_edu.exercises.lesson01 import (
    TYPICAL_ALPHA,
    TYPICAL_BETA,
    check_echo,
    check_prediction,
    check_small_message_answer,
)

ALPHA, BETA = TYPICAL_ALPHA, TYPICAL_BETA
N = 1 << 20  # 64 messages of 1 MiB
RIGHT = 64 * (ALPHA + N * BETA)


def test_prediction():
    assert check_prediction(RIGHT, ALPHA, BETA)


@pytest.mark.parametrize("answer, hint", [(RIGHT * 1e3, "milliseconds"), (ALPHA, "α alone"),
                                          (ALPHA + 64 * N * BETA, "one message of 64 MiB"),
                                          (ALPHA + N * BETA, "there are 64 of them"),
                                          (64 * ALPHA, "64 α's alone"),
                                          (64 * N / BETA, "units"), (-1, "positive"), (3 * RIGHT, "factor"),
                                          ("fast", "number of seconds")])
def test_wrong_predictions(answer, hint):
    feedback = check_prediction(answer, ALPHA, BETA)
    assert not feedback and feedback.attempted and hint in feedback.message, feedback


def test_prediction_scaffold_is_not_an_attempt():
    feedback = check_prediction(None, ALPHA, BETA)
    assert not feedback and not feedback.attempted and 'hint("01.1")' in feedback.message


def right(comm):
    if comm.rank == 0:
        comm.send(1, np.arange(5), tag="ping")
        return comm.recv(1, tag="pong")
    x = comm.recv(0, tag="ping")
    comm.send(0, 2 * x, tag="pong")


def not_doubled(comm):
    if comm.rank == 0:
        comm.send(1, np.arange(5), tag="ping")
        return comm.recv(1, tag="pong")
    comm.send(0, comm.recv(0, tag="ping"), tag="pong")


def tags_disagree(comm):
    if comm.rank == 0:
        comm.send(1, np.arange(5), tag="ping")
        return comm.recv(1, tag="pong")
    comm.send(0, 2 * comm.recv(0, tag="ping"), tag="reply")


def silent(comm):  # sends nothing (a body of just `return None` would count as the empty scaffold)
    return comm.rank


def rank_1_never_answers(comm):
    if comm.rank == 0:
        comm.send(1, np.arange(5), tag="ping")
        return None
    comm.recv(0, tag="ping")


def forgets_to_return(comm):
    if comm.rank == 0:
        comm.send(1, np.arange(5), tag="ping")
        comm.recv(1, tag="pong")
        return None
    comm.send(0, 2 * comm.recv(0, tag="ping"), tag="pong")


def echo_doubled(comm):
    """The scaffold as the lesson ships it."""
    ...  # your code here, in place of `...`


@pytest.mark.processes
def test_echo_checker():
    assert check_echo(right)
    assert "2 * x" in check_echo(not_doubled).message
    assert "same tag" in check_echo(tags_disagree).message
    assert "never sent" in check_echo(silent).message
    assert "never answered" in check_echo(rank_1_never_answers).message
    assert "returned None" in check_echo(forgets_to_return).message


@pytest.mark.processes
def test_echo_scaffold_is_not_an_attempt_and_the_reference_passes():
    feedback = check_echo(echo_doubled)
    assert not feedback and not feedback.attempted and 'hint("01.2")' in feedback.message
    fn = reference("01.2")
    assert fn.__name__ == "echo_doubled" and check_echo(fn)


def test_small_message_answer():
    assert check_small_message_answer("b")
    assert check_small_message_answer(" B ")
    assert "β fell too" in check_small_message_answer("a").message
    assert "fixed cost" in check_small_message_answer("c").message
    assert "no batching" in check_small_message_answer("d").message
    assert "'a', 'b', 'c' or 'd'" in check_small_message_answer("e").message
    feedback = check_small_message_answer("?")
    assert not feedback and not feedback.attempted and 'hint("01.3")' in feedback.message


def test_small_message_feedback_uses_the_measured_alpha_and_beta():
    alpha, beta = 669e-6, 1 / 0.72e9  # what one run of the lesson measured
    right = check_small_message_answer("b", alpha, beta)
    assert right and "your laptop it is 0.67 ms × 0.72 GB/s ≈ 470 KiB" in right.message
    assert "typically" not in right.message
    assert "from your 0.67 ms to 2 µs" in check_small_message_answer("a", alpha, beta).message
    assert "typically 0.50 ms × 1.00 GB/s ≈ 488 KiB" in check_small_message_answer("b").message
    assert not check_small_message_answer("?", alpha, beta).attempted
    assert registry.get("01.3").key.endswith("check_small_message_answer(my_choice, alpha, beta)")


def test_registered_with_hints_and_solutions():
    kinds = {ex: registry.get(ex).kind for ex in ("01.1", "01.2", "01.3")}
    assert kinds == {"01.1": "number", "01.2": "code", "01.3": "choice"}
    assert len(registry.get("01.2").hints) >= 2
    assert registry.get("01.3").solution.startswith("b")
    assert "alpha" in registry.get("01.1").key and "beta" in registry.get("01.1").key
