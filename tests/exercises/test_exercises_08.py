"""Lesson 08's checkers: a right answer passes, typical wrong ones fail with a specific hint."""

from __future__ import annotations

import numpy as np
import pytest

import allreduce_edu
from allreduce_edu.exercises import reference, registry
from allreduce_edu.exercises.lesson08 import (
    check_average_gradients,
    check_bucketing_answer,
    check_message_prediction,
    messages_per_step,
    solution,
)


def per_tensor(comm, grads):
    return [allreduce_edu.allreduce(comm, g, op="sum") / comm.world_size for g in grads]


def _bucketed(comm, grads, groups):
    out = list(grads)
    for group in groups:
        flat = np.concatenate([grads[i].ravel() for i in group])
        summed = allreduce_edu.allreduce(comm, flat) / comm.world_size
        ends = np.cumsum([grads[i].size for i in group])[:-1]
        for i, piece in zip(group, np.split(summed, ends)):
            out[i] = piece.reshape(grads[i].shape)
    return out


def _greedy(grads, cap, check_after=False):
    groups, size = [], 0
    for i, g in enumerate(grads):
        if not groups or (not check_after and size + g.nbytes > cap) or (check_after and size > cap):
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += g.nbytes
    return groups


def right(comm, grads, bucket_bytes=700):
    return _bucketed(comm, grads, _greedy(grads, bucket_bytes))


def right_in_reverse(comm, grads, bucket_bytes=700):  # DDP's order: last layer first
    rev = [[len(grads) - 1 - i for i in group] for group in _greedy(grads[::-1], bucket_bytes)]
    return _bucketed(comm, grads, rev)


def one_bucket(comm, grads):
    return _bucketed(comm, grads, [list(range(len(grads)))])


def overflows(comm, grads, bucket_bytes=700):  # checks the cap after adding, not before
    return _bucketed(comm, grads, _greedy(grads, bucket_bytes, check_after=True))


def pairs(comm, grads):  # W and b together, whatever the cap
    return _bucketed(comm, grads, [[i, i + 1] for i in range(0, len(grads), 2)][:2]
                     + [[i] for i in range(4, len(grads))])


def forgot_to_divide(comm, grads):
    return [allreduce_edu.allreduce(comm, g) for g in grads]


def divided_twice(comm, grads):
    return [allreduce_edu.allreduce(comm, g / comm.world_size) / comm.world_size for g in grads]


def rebinds_loop_variable(comm, grads):
    for g in grads:
        g = allreduce_edu.allreduce(comm, g) / comm.world_size  # the mistake under test
    return grads


def divides_but_drops_the_result(comm, grads):
    for g in grads:
        g /= comm.world_size
        allreduce_edu.allreduce(comm, g)
    return grads


def returns_nothing(comm, grads):
    for i, g in enumerate(grads):
        grads[i] = allreduce_edu.allreduce(comm, g) / comm.world_size


def uses_max(comm, grads):
    return [allreduce_edu.allreduce(comm, g, op="max") for g in grads]


def only_some(comm, grads):
    return [allreduce_edu.allreduce(comm, g) / comm.world_size for g in grads[:2]]


def rank0_skips(comm, grads):
    if comm.rank == 0:
        return grads
    return [allreduce_edu.allreduce(comm, g) / comm.world_size for g in grads]


def whole_list(comm, grads):  # one all-reduce of the ragged list
    return allreduce_edu.allreduce(comm, grads) / comm.world_size


def comm_method(comm, grads):
    return [comm.allreduce(g) / comm.world_size for g in grads]


def mean_op(comm, grads):
    return [allreduce_edu.allreduce(comm, g, op="mean") for g in grads]


def forgot_comm(comm, grads):
    return [allreduce_edu.allreduce(g) / comm.world_size for g in grads]


def size_attribute(comm, grads):
    return [allreduce_edu.allreduce(comm, g) / comm.size for g in grads]


def floor_division(comm, grads):
    return [allreduce_edu.allreduce(comm, g) // comm.world_size for g in grads]


def flattened(comm, grads):
    return [(allreduce_edu.allreduce(comm, g) / comm.world_size).ravel() for g in grads]


def average_gradients(comm, grads, bucket_bytes=700):
    """The scaffold as the lesson ships it."""
    ...  # your code here, in place of `...`


@pytest.mark.processes
def test_average_gradients_passes():
    feedback = check_average_gradients(right)
    assert feedback and "same weights" in feedback.message and "3 buckets" in feedback.message
    assert check_average_gradients(right_in_reverse)


@pytest.mark.processes
@pytest.mark.parametrize("fn, hint", [
    (per_tensor, "one all-reduce per tensor"),
    (one_bucket, "one bucket for everything"),
    (overflows, "before adding it"),
    (pairs, "more buckets than needed"),
])
def test_bucketing_hints(fn, hint):
    feedback = check_average_gradients(fn)
    assert not feedback and hint in feedback.message, feedback


@pytest.mark.processes
@pytest.mark.parametrize("fn, hint", [
    (forgot_to_divide, "forgot to divide"),
    (divided_twice, "twice"),
    (rebinds_loop_variable, "does not change the list"),
    (divides_but_drops_the_result, "threw away"),
    (returns_nothing, "returned None"),
    (uses_max, "op=\"sum\""),
    (only_some, "returned 2 arrays"),
    (rank0_skips, "raised"),
    (whole_list, "all-reduce each gradient on its own"),
    (comm_method, "not a method of comm"),
    (mean_op, "then divide by comm.world_size"),
    (forgot_comm, "takes the communicator first"),
    (size_attribute, "the number of ranks is comm.world_size"),
    (floor_division, "Divide with /"),
    (flattened, "keep every gradient's shape"),
])
def test_average_gradients_hints(fn, hint):
    feedback = check_average_gradients(fn)
    assert not feedback and hint in feedback.message, feedback


def test_message_prediction():
    assert check_message_prediction(112, 240)
    assert check_message_prediction(112.0, 240.0)  # a whole number written as a float is fine
    # another model, another cap: [2 2] [4] [1 1 1] -> 3 buckets of 2(N-1) messages
    assert check_message_prediction(42, 90, sizes=(2, 2, 4, 1, 1, 1), cap=4)
    assert messages_per_step((3, 2, 3, 2, 3, 2, 1, 1, 6, 1), 4, 8) == 112
    assert messages_per_step((3, 2, 3, 2, 3, 2, 1, 1, 6, 1), 4, 16) == 240


@pytest.mark.parametrize("on_8, on_16, hint", [
    (56, 240, "one phase"), (896, 240, "rank 0's alone"), (128, 240, "not N"), (140, 240, "one all-reduce per tensor"),
    (84, 240, "6 full buckets"), (70, 240, "pass the cap"), (8, 240, "counts buckets"),
    (112, 112, "count on 8 ranks"), (112, 120, "one phase"), (112.5, 240, "whole number"), (99, 240, "find the buckets"),
    ("112", 240, "answer with a number"), (112, -240, "positive"),
])
def test_message_prediction_hints(on_8, on_16, hint):
    feedback = check_message_prediction(on_8, on_16)
    assert not feedback and hint in feedback.message, feedback


def test_bucketing_answer():
    assert check_bucketing_answer("b") and check_bucketing_answer(" B ")
    assert "the same bytes" in check_bucketing_answer("a").message
    assert "what is each one worth now" in check_bucketing_answer("c").message
    assert "still latency-bound" in check_bucketing_answer("d").message
    assert "'a', 'b', 'c' or 'd'" in check_bucketing_answer("e").message


def test_the_scaffolds_are_not_attempts():
    for feedback, exercise in ((check_average_gradients(average_gradients), "08.1"),
                               (check_message_prediction(None, None), "08.2"),
                               (check_message_prediction(112, None), "08.2"),  # half an answer
                               (check_bucketing_answer("?"), "08.3")):
        assert not feedback and not feedback.attempted, feedback
        assert f'hint("{exercise}")' in feedback.message


def test_solutions_exist(capsys):
    for exercise in ("08.1", "08.2", "08.3"):
        solution(exercise)
    assert "world_size" in capsys.readouterr().out
    for exercise, kind in (("08.1", "code"), ("08.2", "number"), ("08.3", "choice")):
        ex = registry.get(exercise)
        assert ex.kind == kind and ex.solution and len(ex.hints) >= (2 if kind == "code" else 1)
    assert "112" in registry.get("08.2").solution and registry.get("08.3").solution.startswith("b")


@pytest.mark.processes
def test_the_solution_passes_its_checker():
    fn = reference("08.1")
    assert fn.__name__ == "average_gradients"
    assert check_average_gradients(fn)


@pytest.mark.parametrize("exercise", ["08.2", "08.3"])
def test_the_key_cells_pass(exercise):
    *body, last = registry.get(exercise).key.splitlines()
    namespace = {}
    exec("\n".join([*body, f"result = {last}"]), namespace)  # noqa: S102 - our own key
    assert namespace["result"], namespace["result"]


def _divides_by_three(comm, grads, bucket_bytes=700):
    """The solution with the world size written as the number the checker used to run with."""
    from allreduce_edu import allreduce
    from allreduce_edu.training.data_parallel import bucket_layout

    out = [None] * len(grads)
    for group in bucket_layout([g.nbytes for g in grads], bucket_bytes):
        flat = allreduce(comm, np.concatenate([grads[i].reshape(-1) for i in group])) / 3
        at = 0
        for i in group:
            out[i] = flat[at:at + grads[i].size].reshape(grads[i].shape)
            at += grads[i].size
    return out


@pytest.mark.processes
def test_a_world_size_written_as_a_number_is_refused():
    """The checker runs on 3, then 4 ranks: `/ 3` passes the first and is named on the second."""
    feedback = check_average_gradients(_divides_by_three)
    assert feedback.status == "failed", feedback
    assert "with 4 ranks: rank 0, gradient 0" in feedback.message
    assert "the sum divided by 3, but this run has 4 ranks" in feedback.message
    assert "comm.world_size" in feedback.message
