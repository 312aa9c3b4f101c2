"""Lesson 04's checkers: a right answer passes, typical wrong ones fail with a specific hint."""

from __future__ import annotations

import numpy as np
import pytest

from allreduce_edu.exercises import reference, registry
from allreduce_edu.exercises.lesson04 import (
    bytes_per_step,
    check_crossover_answer,
    check_step_prediction,
    check_tree_reduce,
    solution,
)


def right(comm, x):
    acc = np.array(x, copy=True)
    distance = 1
    while distance < comm.world_size:
        if comm.rank & distance:
            comm.send(comm.rank - distance, acc, "reduce")
            return None
        if comm.rank + distance < comm.world_size:
            acc += comm.recv(comm.rank + distance, "reduce")
        distance *= 2
    return acc


def highest_bit_first(comm, x):
    """Sends to rank - 2^(highest bit): rank 3 sends to 1, not 2."""
    acc = np.array(x, copy=True)
    if comm.rank:
        comm.send(comm.rank - (1 << (comm.rank.bit_length() - 1)), acc, "reduce", step=0)
        return None
    for src in range(1, comm.world_size):
        if src & (src - 1) == 0:
            acc += comm.recv(src, "reduce")
    return acc


def forwards_own_data(comm, x):
    """Right pattern, but each rank sends its own x, not what it has added up."""
    acc = np.array(x, copy=True)
    distance = 1
    while distance < comm.world_size:
        if comm.rank & distance:
            comm.send(comm.rank - distance, x, "reduce")
            return None
        if comm.rank + distance < comm.world_size:
            acc += comm.recv(comm.rank + distance, "reduce")
        distance *= 2
    return acc


def no_bounds_check(comm, x):
    acc = np.array(x, copy=True)
    distance = 1
    while distance < comm.world_size:
        if comm.rank & distance:
            comm.send(comm.rank - distance, acc, "reduce")
            return None
        acc += comm.recv(comm.rank + distance, "reduce")
        distance *= 2
    return acc


def sends_twice(comm, x):
    """Forgets to stop after sending: on 4 ranks, rank 3 sends at distance 1 and again at 2."""
    acc = np.array(x, copy=True)
    distance = 1
    while distance < comm.world_size:
        if comm.rank & distance:
            comm.send(comm.rank - distance, acc, "reduce")
        elif comm.rank + distance < comm.world_size:
            acc += comm.recv(comm.rank + distance, "reduce")
        distance *= 2
    return acc


def my_tree_reduce(comm, x):
    """The scaffold as the lesson ships it."""
    ...  # your code here, in place of `...`


@pytest.mark.processes
@pytest.mark.parametrize("fn", [right, reference("04.1")], ids=["right", "the solution"])
def test_tree_reduce_checker_passes_a_binomial_reduce(fn):
    feedback = check_tree_reduce(fn)
    assert feedback, feedback


@pytest.mark.processes
@pytest.mark.parametrize("fn, worlds, words", [  # each on the smallest world that shows the mistake
    (highest_bit_first, ((4, 1),), "rank 3 sent to rank 1 at step 0, but in a binomial tree rank 3 sends to rank 2 (3 − 2^0)"),
    (forwards_own_data, ((4, 9),), "missing the data of rank(s) [3]"),
    (no_bounds_check, ((3, 7),), "outside the world"),
    (sends_twice, ((4, 9),), "rank 3 sent 2 messages (to 2, then 1)"),
    (lambda comm, x: x, ((3, 7),), "rank 1 never sent its partial sum"),
])
def test_tree_reduce_checker_names_the_first_mistake(fn, worlds, words):
    feedback = check_tree_reduce(fn, worlds=worlds)
    assert not feedback and words in feedback.message, feedback


def test_step_prediction():
    assert check_step_prediction(8, 5)
    assert check_step_prediction(tree=8.0, recursive_doubling=np.int64(5))
    assert "one phase" in check_step_prediction(4, 5).message
    assert "ring's count" in check_step_prediction(24, 5).message
    assert "round it up" in check_step_prediction(6, 5).message
    assert "fold and the unfold" in check_step_prediction(8, 3).message
    assert "does not round up" in check_step_prediction(8, 4).message
    assert "one exchange phase" in check_step_prediction(8, 6).message
    assert "whole number" in check_step_prediction(7.5, 5).message
    assert "answer with a number of steps" in check_step_prediction("eight", 5).message


def test_crossover_answer():
    assert check_crossover_answer("a")
    assert "2046 steps" in check_crossover_answer("c").message
    assert "N sets the factor" in check_crossover_answer("b").message
    assert "ring still wins" in check_crossover_answer("d").message
    assert "'a', 'b', 'c' or 'd'" in check_crossover_answer("e").message


def test_bytes_per_step_and_solutions(capsys):
    from allreduce_edu import Cluster, allreduce
    with Cluster(4, transport="local") as cluster:
        cluster.run(lambda comm: allreduce(comm, np.ones(8), algorithm="ring"))
        assert set(bytes_per_step(cluster.trace).values()) == {16}
    solution("04.1")
    assert "comm.rank & distance" in capsys.readouterr().out
    solution("04.2")
    assert "8 steps in all" in capsys.readouterr().out


def test_the_scaffolds_are_not_attempts():
    for feedback, exercise in ((check_tree_reduce(my_tree_reduce), "04.1"),
                               (check_step_prediction(tree=None, recursive_doubling=None), "04.2"),
                               (check_step_prediction(tree=8, recursive_doubling=None), "04.2"),
                               (check_crossover_answer("?"), "04.3")):
        assert not feedback and not feedback.attempted, feedback
        assert f'hint("{exercise}")' in feedback.message


def run_key(exercise):
    """What the last line of an exercise's key cell (its checker call) returns."""
    *body, last = registry.get(exercise).key.splitlines()
    namespace = {}
    exec("\n".join([*body, f"result = {last}"]), namespace)  # noqa: S102 - our own key
    return namespace["result"]


@pytest.mark.parametrize("exercise", ["04.2", "04.3"])
def test_the_key_cells_pass(exercise):
    feedback = run_key(exercise)
    assert feedback, feedback
