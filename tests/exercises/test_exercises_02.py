"""Lesson 02's checkers: a right answer passes, typical wrong ones fail with a specific hint."""

from __future__ import annotations

import numpy as np
import pytest

from allreduce_edu.exercises import reference, registry
from allreduce_edu.exercises.harness import decode, encoded_input
from allreduce_edu.exercises.lesson02 import (
    check_bottleneck_answer,
    check_naive_allreduce,
    check_root_bytes,
)

# wrong answers: the same checks on thread ranks, which start at once (the right answer runs on gRPC)
QUICK = {"world_sizes": (3,), "shapes": ((10,),), "timeout": 2.0, "transport": "local"}


def naive(comm, x):
    if comm.rank != 0:
        comm.send(0, x, tag="reduce")
        return comm.recv(0, tag="broadcast")
    total = x.copy()
    for src in range(1, comm.world_size):
        total += comm.recv(src, tag="reduce")
    for dst in range(1, comm.world_size):
        comm.send(dst, total, tag="broadcast")
    return total


def no_broadcast(comm, x):  # the others wait for a sum that never comes
    if comm.rank != 0:
        comm.send(0, x, tag="reduce")
        return comm.recv(0, tag="broadcast")
    total = x.copy()
    for src in range(1, comm.world_size):
        total += comm.recv(src, tag="reduce")
    return total


def no_broadcast_no_wait(comm, x):  # the others keep their own x
    if comm.rank != 0:
        comm.send(0, x, tag="reduce")
        return x
    total = x.copy()
    for src in range(1, comm.world_size):
        total += comm.recv(src, tag="reduce")
    return total


def root_forgets_itself(comm, x):
    if comm.rank != 0:
        comm.send(0, x, tag="reduce")
        return comm.recv(0, tag="broadcast")
    total = np.zeros_like(x)
    for src in range(1, comm.world_size):
        total += comm.recv(src, tag="reduce")
    for dst in range(1, comm.world_size):
        comm.send(dst, total, tag="broadcast")
    return total


def modifies_input(comm, x):
    if comm.rank != 0:
        comm.send(0, x, tag="reduce")
        return comm.recv(0, tag="broadcast")
    total = x  # another name for x: += writes into the caller's array
    for src in range(1, comm.world_size):
        total += comm.recv(src, tag="reduce")
    for dst in range(1, comm.world_size):
        comm.send(dst, total, tag="broadcast")
    return total


def passes_it_on(comm, x):  # a chain, not a star
    n, r = comm.world_size, comm.rank
    if r == n - 1:
        comm.send(r - 1, x, tag="reduce")
        return comm.recv(0, tag="broadcast")
    acc = x + comm.recv(r + 1, tag="reduce")
    if r > 0:
        comm.send(r - 1, acc, tag="reduce")
        return comm.recv(0, tag="broadcast")
    for dst in range(1, n):
        comm.send(dst, acc, tag="broadcast")
    return acc


def my_naive_allreduce(comm, x):
    """The scaffold as the lesson ships it."""
    ...  # your code here, in place of `...`


def sends_its_sum_twice(comm, x):
    if comm.rank != 0:
        comm.send(0, x, tag="reduce")
        return comm.recv(0, tag="broadcast")
    total = x.copy()
    for src in range(1, comm.world_size):
        total += comm.recv(src, tag="reduce")
    for dst in (*range(1, comm.world_size), 1):
        comm.send(dst, total, tag="broadcast")
    return total


@pytest.mark.processes
def test_right_answer_passes():
    feedback = check_naive_allreduce(naive)
    assert feedback, feedback
    assert "received 3 messages, 2400072 bytes" in feedback.message


@pytest.mark.parametrize("fn, words", [
    (no_broadcast, ["never came", "never sent the sum back", "broadcast"]),
    (no_broadcast_no_wait, ["never sent the sum back", "broadcast"]),
    (root_forgets_itself, ["without its own x", "x.copy()"]),
    (modifies_input, ["input x changed", "x.copy()"]),
    (passes_it_on, ["talks only to the root"]),
    (sends_its_sum_twice, ["send the sum once to each other rank"]),
])
def test_wrong_answers_get_specific_hints(fn, words):
    feedback = check_naive_allreduce(fn, **QUICK)
    assert not feedback
    for word in words:
        assert word in feedback.message, feedback


def test_decode_names_ranks_and_positions():
    total = encoded_input(0, (6,)) + encoded_input(2, (6,)) + encoded_input(2, (6,))
    assert decode(total[2:5], 3) == (2, (1, 0, 2))
    assert decode(total[::-1], 3) == (None, None)  # out of order
    assert decode(total.astype(np.float32), 3) == (None, None)


MIB = 1 << 20


@pytest.mark.parametrize("sent, received, hint", [(264, 22, "MiB"), (11, 11, "number of messages"),
                                                  (288 * MIB, 22 * MIB, "counts the root itself"),
                                                  (264 * MIB, 24 * MIB, "counts the root itself"),
                                                  (264 * MIB, 2 * MIB, "one rank's buffer"),
                                                  (22 * MIB, 22 * MIB, "one buffer per answer"),
                                                  (264 * MIB, 264 * MIB, "what the root sends"),
                                                  (264 * MIB, 11 * MIB, "the lesson's table"),
                                                  (132 * MIB, 22 * MIB, "the lesson's table"),
                                                  (11, 22 * MIB, "each carries everything it gathered"),
                                                  (264 * MIB, 5, "not it"),
                                                  ("many", 22 * MIB, "number of bytes")])
def test_root_bytes_of_a_naive_all_gather(sent, received, hint):
    assert check_root_bytes(264 * MIB, 22 * MIB)
    assert check_root_bytes(11 * 12 * 2097152, (12 - 1) * (2 << 20))
    feedback = check_root_bytes(sent, received)
    assert not feedback and hint in feedback.message, feedback


def test_the_root_bytes_question_is_no_look_up_in_the_lessons_table():
    """The table counts an all-reduce's root, (N − 1)·S each way; 02.2 asks about an all-gather,
    where that is right one way only."""
    assert not check_root_bytes(22 * MIB, 22 * MIB)


def test_bottleneck_answer():
    assert check_bottleneck_answer("c")
    assert "busiest link" in check_bottleneck_answer("a").message
    assert "one message, not a second round" in check_bottleneck_answer("b").message
    assert "Better, not gone" in check_bottleneck_answer("d").message
    assert "'a', 'b', 'c' or 'd'" in check_bottleneck_answer("e").message
    assert not check_bottleneck_answer("").attempted  # an empty answer is the scaffold's, not a try


def test_the_scaffolds_are_not_attempts():
    for feedback, exercise in ((check_naive_allreduce(my_naive_allreduce), "02.1"),
                               (check_root_bytes(None, None), "02.2"),
                               (check_root_bytes(22 << 20, None), "02.2"),  # half an answer: not checked yet
                               (check_bottleneck_answer("?"), "02.3")):
        assert not feedback and not feedback.attempted, feedback
        assert f'hint("{exercise}")' in feedback.message


def test_solutions_registered():
    for exercise, kind in (("02.1", "code"), ("02.2", "number"), ("02.3", "choice")):
        ex = registry.get(exercise)
        assert ex.kind == kind and ex.solution and len(ex.hints) >= (2 if kind == "code" else 1)
    assert registry.get("02.3").solution.startswith("c")
    assert "23068672" in registry.get("02.2").solution and "276824064" in registry.get("02.2").solution
    fn = reference("02.1")
    assert fn.__name__ == "my_naive_allreduce"
    assert check_naive_allreduce(fn, **{**QUICK, "world_sizes": (3, 4)})


def test_02b_is_asked_before_the_model_that_answers_it():
    """The naive time formula follows the measurement 02.b predicts, so the guess is not arithmetic."""
    from allreduce_edu import course

    [path] = [p for p in course.lesson_files() if p.name.startswith("02")]
    text = [course.source(c) for c in course.read(path)["cells"]]
    asked = next(i for i, t in enumerate(text) if 'predict("02.b"' in t)
    formula = "t ≈ 2(N − 1)·(α + S·β)"
    assert not any(formula in t for t in text[:asked + 1])
    assert any(formula in t for t in text[asked + 1:])
