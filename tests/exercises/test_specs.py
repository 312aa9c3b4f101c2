"""Exercises as data: specs generate checker, key and scaffold; hints climb to the idea; choices
do not give themselves away by length."""

from __future__ import annotations

import re

import pytest

from allreduce_edu import course
from allreduce_edu.exercises import registry, spec

EXERCISES = registry.all_exercises()
SPECS = {i: ex for i, ex in EXERCISES.items() if ex.kind != "code" and ex.spec is not None}


def test_every_choice_number_and_names_exercise_is_a_spec():
    bespoke = {i for i, ex in EXERCISES.items() if ex.kind != "code" and ex.spec is None}
    assert not bespoke, f"write these as specs (exercises/spec.py): {sorted(bespoke)}"


CODE_LIKE = re.compile(r"\w\(|\w\[|\s[+\-*/]?=\s|`")


@pytest.mark.parametrize("exercise", sorted(i for i, ex in EXERCISES.items() if ex.kind == "code"))
def test_code_hints_climb_to_the_key_idea_in_words(exercise):
    hints = EXERCISES[exercise].hints
    assert len(hints) >= 3, f"{exercise} has {len(hints)} hints"
    assert not CODE_LIKE.search(hints[-1]), f"{exercise}'s last hint is code: {hints[-1]}"
    assert not all(CODE_LIKE.search(h) for h in hints), f"every hint of {exercise} is code"


def test_the_right_option_is_the_longest_in_at_most_a_third_of_the_choices():
    choices = [ex.spec for ex in SPECS.values() if ex.kind == "choice"]
    assert len(choices) >= 10
    longest = [s for s in choices if len(s.options[s.right]) >= max(map(len, s.options.values()))]
    assert 3 * len(longest) <= len(choices), [s.cell.checker for s in longest]


@pytest.mark.parametrize("exercise", sorted(i for i, ex in SPECS.items() if ex.kind == "choice"))
def test_every_wrong_option_has_its_own_hint(exercise):
    ex = EXERCISES[exercise]
    options, right = ex.spec.options, ex.spec.right
    assert 3 <= len(options) <= 5
    lengths = [len(text) for text in options.values()]
    assert max(lengths) <= 1.5 * min(lengths), f"{exercise}: options of unlike length {lengths}"
    messages = set()
    for letter in options:
        feedback = ex.check.demo(letter)
        assert bool(feedback) == (letter == right), (exercise, letter)
        messages.add(feedback.message)
    assert len(messages) == len(options)  # a hint of its own for each wrong option
    assert ex.check.demo(f" ({right.upper()}) ")
    assert "answer with" in ex.check.demo("z").message


@pytest.mark.parametrize("exercise", sorted(SPECS))
def test_specs_generate_the_checker_key_scaffold_and_question(exercise):
    ex = SPECS[exercise]
    cell = ex.spec.cell
    assert ex.key == cell.key.strip("\n") and ex.check.__name__ == cell.checker
    assert cell.scaffold.splitlines()[-1] == cell.key.splitlines()[-1]  # the same checker call
    assert cell.scaffold != cell.key
    if ex.spec.markdown is not None:  # None: the lesson asks it in its own words
        assert ex.spec.markdown.startswith(f"**{exercise} — ")
        assert f'hint("{exercise}")' in ex.spec.markdown
    namespace = {"alpha": 1e-4, "beta": 1e-9, "N": 4, "copy_gbps": 10.0, "layer_bytes": (1000, 2000),
                 "fits": {"grpc": (3e-4, 1e-9), "shm": (1e-4, 5e-11)}}  # what the lessons measure
    exec(compile(cell.scaffold, exercise, "exec"), namespace)  # noqa: S102 - the generated scaffold
    key = {k: v for k, v in namespace.items() if k in ("alpha", "beta", "N", "copy_gbps", "layer_bytes", "fits")}
    *body, last = cell.key.splitlines()
    exec(compile("\n".join([*body, f"result = {last}"]), exercise, "exec"), key)  # noqa: S102 - the key
    assert key["result"], key["result"]  # the instructor's key passes its own checker


@pytest.mark.parametrize("exercise", sorted(SPECS))
def test_the_committed_cell_is_the_specs_scaffold_and_its_question_the_specs(exercise):
    lesson = course.read(next(p for p in course.lesson_files() if p.name[:2] == exercise[:2]))
    cells = lesson["cells"]
    cell = course.exercise_cells(lesson)[exercise]
    assert course.source(cell) == SPECS[exercise].spec.cell.scaffold
    if SPECS[exercise].spec.markdown is not None:
        above = "".join(course.source(c) for c in cells[:cells.index(cell)] if c["cell_type"] == "markdown")
        assert SPECS[exercise].spec.markdown in above


def test_one_tolerance_policy():
    assert spec.close(100.0, 101.9) and not spec.close(100.0, 102.1)
    assert spec.close(7, 7, exact=True) and not spec.close(7, 7.0001, exact=True)


def test_a_failure_on_ranks_carries_its_rank_for_the_checkers():
    from allreduce_edu.exercises.harness import explain_error, failed_rank
    from allreduce_edu.runtime import Cluster

    def boom(comm):
        if comm.rank == 2:
            raise ValueError("rank two gives up")
        return comm.rank

    with Cluster(3, "local") as cluster:
        with pytest.raises(ValueError) as caught:
            cluster.run(boom)
    assert failed_rank(caught.value) == 2
    caught.value.__notes__ = []  # no text to read: the attribute alone names the rank
    assert "ValueError on rank 2" in explain_error(caught.value, (10,))
