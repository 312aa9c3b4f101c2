"""Lesson 16's checkers: a right answer passes, typical wrong ones fail with a specific hint."""

from __future__ import annotations

import pytest

from allreduce_edu.collectives.double_binary_tree import btree, mirror_tree, trees
from allreduce_edu.exercises import reference
from allreduce_edu.exercises.lesson16 import (
    check_tree2,
    check_tuner_choice,
    nccl_trees_line,
    nccl_tuning_lines,
    pipelined_model,
    port_bytes,
    tuned_choice,
    tuner_agreement,
)


def relabelled(n, rank, forward, back):
    """Tree 1 with ranks renamed: rank plays tree 1's back(rank); its parent and children map
    forward."""
    parent, children = btree(n, back(rank))
    return (-1 if parent < 0 else forward(parent)), [forward(c) for c in children]


def shift_always(n, rank):
    """Shift by one for every N: also a valid tree 2 (NCCL mirrors for even N, but either works)."""
    return relabelled(n, rank, lambda r: (r + 1) % n, lambda r: (r - 1) % n)


def mirror_always(n, rank):
    return relabelled(n, rank, lambda r: n - 1 - r, lambda r: n - 1 - r)


def same_tree(n, rank):
    return btree(n, rank)


def rank_only(n, rank):
    """Relabels the rank but keeps tree 1's parent and children."""
    return btree(n, n - 1 - rank)


def shift_without_wrap(n, rank):
    parent, children = btree(n, (rank - 1) % n)
    return (-1 if parent < 0 else parent + 1), [c + 1 for c in children]


def chain(n, rank):
    return rank - 1, [rank + 1] if rank + 1 < n else []


def test_the_solution_and_the_library_pass():
    assert check_tree2(reference("16.1"))
    assert check_tree2(mirror_tree)


def test_shifting_for_every_n_passes_too():
    assert check_tree2(shift_always)


@pytest.mark.parametrize("fn, words", [
    (same_tree, "on 4 ranks rank 2 has 2 children in tree 1 and 2 in tree 2"),
    (mirror_always, "For odd N the mirror"),
    (rank_only, "Relabel the parent and the"),
    (shift_without_wrap, "names 2 as a child"),
    (chain, "rank 2 has 2 children in tree 1 and 1 in tree 2"),
    (lambda n, r: (r,), "return (parent, children)"),
    (lambda n, r: 1 / 0, "raised ZeroDivisionError"),
])
def test_typical_wrong_trees_fail_naming_the_rank(fn, words):
    feedback = check_tree2(fn)
    assert not feedback and feedback.attempted
    assert words in " ".join(feedback.message.split()), feedback.message


def test_a_deep_tree_2_fails_on_its_depth():
    parent = {7: -1, 5: 7, 3: 5, 6: 5, 1: 3, 4: 3, 0: 1, 2: 0}  # interior only where tree 1 has room

    def deep(n, rank):
        return parent[rank], [c for c, p in parent.items() if p == rank]

    feedback = check_tree2(deep, worlds=(8,))
    assert not feedback and "5 levels deep, tree 1 3" in feedback.message


def test_port_bytes_of_the_double_binary_tree_is_at_most_two_halves_each_way():
    for n in range(2, 10):
        sent = port_bytes(*trees(n), 1000)
        assert max(sent) <= 2000 and (n < 4 or max(sent) == 2000)


def test_the_tuner_exercise_matches_the_tuner():
    assert tuned_choice() == ("double_binary_tree", "Simple")
    assert check_tuner_choice("b") and check_tuner_choice(" B ")
    for wrong, words in (("a", "126"), ("c", "12 whole-buffer"), ("d", "flag")):
        feedback = check_tuner_choice(wrong)
        assert not feedback and words in feedback.message
    assert "answer with" in check_tuner_choice("e").message


def test_the_pipelined_model_is_the_registered_cost_at_the_librarys_k():
    from allreduce_edu import TESTBED
    from allreduce_edu.collectives.double_binary_tree import pipeline_chunks
    from allreduce_edu.model.costmodel import predict_on_links

    for s in (8, 1 << 20, 16 << 20):
        k = pipeline_chunks(s)
        assert pipelined_model(8, s, k) == pytest.approx(
            predict_on_links("double_binary_tree", 8, s, TESTBED))
    assert pipelined_model(8, 16 << 20, 4) < pipelined_model(8, 16 << 20, 1)


def test_nccl_lines_follow_nccls_formats():
    assert nccl_trees_line(8, 0) == "NCCL INFO Trees [0] 4/-1/-1->0->-1 [1] -1/-1/-1->0->1"
    assert nccl_trees_line(8, 4) == "NCCL INFO Trees [0] 2/6/-1->4->0 [1] -1/-1/-1->4->5"
    row = {"algorithm": "ring", "protocol": "Simple", "size": 1024, "time": 12.5e-6}
    info, trace = nccl_tuning_lines(row)
    assert info == "NCCL INFO Best tuning, algorithm, Ring, protocol, Simple"
    assert trace == "NCCL TRACE 1024 Bytes -> Algo 1 proto 2 time 12.500000"


def test_tuner_agreement_compares_the_tuner_with_the_fastest_row():
    rows = [{"algorithm": a, "bytes": s, "world_size": 8, "time_us": t}
            for a, s, t in (("ring", 8, 180e3), ("tree", 8, 80e3), ("ring", 16 << 20, 500e3),
                            ("tree", 16 << 20, 1100e3))]
    assert tuner_agreement(rows) == [(8, "tree", "tree"), (16 << 20, "ring", "ring")]
