"""Lesson 01's checkers: a right answer passes, typical wrong ones fail with a specific hint."""

from __future__ import annotations

import numpy as np
import pytest

from allreduce_edu.exercises.lesson01 import check_echo, check_prediction, check_small_message_answer

ALPHA, BETA = 300e-6, 1 / 1.2e9
N = 64 << 20


def test_prediction():
    assert check_prediction(ALPHA + N * BETA, ALPHA, BETA)


@pytest.mark.parametrize("answer, hint", [((ALPHA + N * BETA) * 1e3, "milliseconds"), (ALPHA, "α alone"),
                                          (N / BETA, "units"), (-1, "positive"), (3 * (ALPHA + N * BETA), "factor")])
def test_wrong_predictions(answer, hint):
    feedback = check_prediction(answer, ALPHA, BETA)
    assert not feedback and hint in feedback.message, feedback


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


def silent(comm):
    return None


def test_echo_checker():
    assert check_echo(right)
    assert "2 * x" in check_echo(not_doubled).message
    assert "same tag" in check_echo(tags_disagree).message
    assert "never sent" in check_echo(silent).message


def test_small_message_answer():
    assert check_small_message_answer("b")
    assert "y-intercept" in check_small_message_answer("a").message
    assert "copying" in check_small_message_answer("c").message
    assert "'a', 'b' or 'c'" in check_small_message_answer("d").message
