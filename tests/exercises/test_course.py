"""The course as a whole: every exercise ships as a scaffold, answers only on request, progress recorded."""

from __future__ import annotations

import inspect
import json
import re

import pytest

from allreduce_edu import course
from allreduce_edu.course.extras import skip_reason
from allreduce_edu.exercises import hint, progress, reference, registry, solution
from allreduce_edu.exercises.feedback import Feedback

EXERCISES = registry.all_exercises()
LESSONS = {p.name[:2]: course.read(p) for p in course.lesson_files()}
CELLS = {ex: (lesson, cell) for lesson, nb in LESSONS.items() for ex, cell in course.exercise_cells(nb).items()}


def key_lines(text: str) -> list[str]:
    """The lines of a solution that give it away: code, without comments, signatures and one-word lines."""
    lines = []
    for line in text.splitlines():
        code = line.split("#")[0].strip()
        if len(code) >= 12 and not code.startswith(("def ", "from ", "import ", "return x", '"""')):
            lines.append(code)
    return lines


def test_every_exercise_has_exactly_one_cell_in_its_lesson():
    assert sorted(CELLS) == sorted(EXERCISES)
    for ex, (lesson, _) in CELLS.items():
        assert ex.startswith(lesson + "."), f"exercise {ex} sits in lesson {lesson}"


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_committed_cell_is_a_scaffold_whose_output_is_not_attempted(exercise):
    _, cell = CELLS[exercise]
    shown = course.feedback(cell)
    assert "○ not attempted yet" in shown and "✓" not in shown, shown


@pytest.mark.parametrize("lesson", sorted(LESSONS))
def test_no_exercise_cell_holds_an_answer(lesson):
    cells = course.exercise_cells(LESSONS[lesson])
    for exercise, cell in cells.items():
        ex, body = EXERCISES[exercise], course.source(cell)
        answer = key_lines(ex.solution) if ex.kind == "code" else []
        scaffold = {line.split("#")[0].strip() for line in body.splitlines()}
        for line in key_lines(ex.key):  # what the key changes is the answer: its value must not be in the cell
            if line not in scaffold:
                value = re.split(r"\s=\s|:\s", line, maxsplit=1)[-1].rstrip(",").strip()
                answer += [value] if len(value) >= 4 else []  # "b": a letter the scaffold lists anyway
        leaked = [line for line in answer if line in body]
        assert not leaked, f"the scaffold of {exercise} holds lines of its answer: {leaked}"


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_checker_answers_not_attempted_for_the_scaffold(exercise):
    ex = EXERCISES[exercise]
    scaffold = {"code": registry._stub, "number": None, "choice": "?", "names": {"rank": "?"}}[ex.kind]
    feedback = ex.check(scaffold)
    assert isinstance(feedback, Feedback) and not feedback and not feedback.attempted
    assert f'hint("{exercise}")' in feedback.message
    assert all(len(line) <= 90 for line in repr(feedback).splitlines())


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_hints_come_in_steps_then_point_at_the_solution(exercise, capsys):
    ex = EXERCISES[exercise]
    assert len(ex.hints) >= 3, f"{exercise} has {len(ex.hints)} hints: they climb in three rungs or more"
    registry._hints_given.pop(exercise, None)
    for _ in range(len(ex.hints) + 1):
        hint(exercise)
    shown = capsys.readouterr().out
    assert all(len(line) <= 90 for line in shown.splitlines())  # no line breaks mid-word in a notebook
    flat = " ".join(shown.split())
    for k, text in enumerate(ex.hints):
        assert " ".join(f"Hint {k + 1} of {len(ex.hints)} for {exercise}: {text}".split()) in flat
    assert flat.endswith(f'solution("{exercise}") shows an answer.')
    solution(exercise)
    assert capsys.readouterr().out.strip().startswith(ex.solution.strip()[:40])


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_no_hint_repeats_the_solution(exercise):
    """Hints stop at the key idea (LESSONS.md): none holds a line of solution() verbatim — a line of
    its code, a line of its prose — nor, for a choice, the right option's text."""
    ex = EXERCISES[exercise]
    if ex.kind == "code":
        lines = [" ".join(line.split()) for line in key_lines(ex.solution)]
    else:
        lines = [" ".join(line.split()) for line in ex.solution.splitlines() if len(line.strip()) >= 20]
    if ex.kind == "choice":
        lines.append(" ".join(ex.spec.options[ex.spec.right].split()))
    hints = [" ".join(text.split()) for text in ex.hints]
    leaked = [(k + 1, line) for k, text in enumerate(hints) for line in lines if line in text]
    assert not leaked, f"hints of {exercise} repeat its solution: {leaked}"


@pytest.mark.parametrize("exercise", sorted(e for e, x in EXERCISES.items() if x.kind == "code"))
def test_code_solutions_define_the_function_the_learner_writes(exercise):
    lesson, cell = CELLS[exercise]
    needs = skip_reason(LESSONS[lesson]["metadata"], cell.get("metadata", {}))
    if needs:  # its answer runs what this machine lacks (lesson 14 on a Mac): as nbval skips it
        pytest.skip(f"exercise {exercise} {needs}")
    fn = reference(exercise)
    assert fn.__name__ == EXERCISES[exercise].function and not registry.is_stub(fn)
    assert f"def {fn.__name__}(" in EXERCISES[exercise].key


def test_key_cells_end_with_the_same_checker_call_as_the_scaffold():
    for exercise, (_, cell) in CELLS.items():
        last = course.source(cell).strip().splitlines()[-1]
        assert EXERCISES[exercise].key.strip().splitlines()[-1].split("(")[0] == last.split("(")[0], exercise


def test_unknown_exercise_names_the_known_ones():
    with pytest.raises(KeyError, match="03.1"):
        hint("99.9")


def test_progress_is_recorded_in_the_data_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("ALLREDUCE_EDU_DATA_DIR", str(tmp_path))
    from allreduce_edu.exercises.lesson03 import (
        check_busbw_answer,
        check_ring_bytes,
        ring_bytes_sent,
    )

    assert "0 of" in repr(progress(reset=True)).splitlines()[-1]
    assert not check_ring_bytes(None).attempted  # a scaffold is not an attempt
    assert not (tmp_path / "progress.json").exists()
    assert not check_busbw_answer("a")
    assert check_busbw_answer("d")
    assert not check_busbw_answer("b")  # a later wrong answer keeps the pass, and is not a try
    defaults = inspect.signature(check_ring_bytes).parameters
    n, count = defaults["world_size"].default, defaults["count"].default
    assert check_ring_bytes(ring_bytes_sent(count, n))
    data = json.loads((tmp_path / "progress.json").read_text())
    assert data["03.4"]["status"] == "passed" and data["03.4"]["attempts"] == 2
    table = repr(progress())
    assert re.search(r"03\.4\s+.*✓ passed \(2 tries\)", table)
    assert re.search(r"03\.1\s+.*· not started", table)
    assert f"2 of {len(EXERCISES)} passed, 0 attempted" in table
    progress(reset=True)
    assert not (tmp_path / "progress.json").exists()


def test_progress_never_breaks_a_checker_when_the_folder_is_unwritable(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("ALLREDUCE_EDU_DATA_DIR", str(blocker / "data"))
    from allreduce_edu.exercises.lesson03 import check_busbw_answer

    with pytest.warns(UserWarning, match="could not save your progress"):
        assert check_busbw_answer("d")


def test_learner_or_reference_runs_the_reference_until_the_learner_passes(capsys):
    from allreduce_edu.exercises.lesson03 import check_ring_allreduce, learner_or_reference

    def my_ring_allreduce(comm, x):
        ...

    check_ring_allreduce(my_ring_allreduce)
    fn = learner_or_reference("03.1", my_ring_allreduce)
    assert fn is not my_ring_allreduce and fn.__name__ == "my_ring_allreduce"
    assert "not written yet" in capsys.readouterr().out
    right = reference("03.1")
    assert check_ring_allreduce(right, world_sizes=(3,), shapes=((10,),), transport="local")
    assert learner_or_reference("03.1", right) is right
    assert "Running your my_ring_allreduce" in capsys.readouterr().out


def test_tests_never_write_to_the_users_data_directory():
    from allreduce_edu.exercises.progress import data_dir

    assert "allreduce-edu-test-data-" in str(data_dir())


@pytest.mark.parametrize("lesson", sorted(LESSONS))
def test_a_lesson_holds_at_most_forty_cells(lesson):
    """One idea per cell, about forty cells a lesson at most (LESSONS.md): a longer one is split."""
    assert len(LESSONS[lesson]["cells"]) <= 40, f"lesson {lesson}: {len(LESSONS[lesson]['cells'])} cells"


@pytest.mark.parametrize("lesson", sorted(LESSONS))
def test_pictures_fit_a_jupyterlab_column(lesson):
    """ASCII pictures stay within 90 columns: a 1280 px JupyterLab window with the file browser open."""
    for i, cell in enumerate(LESSONS[lesson]["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        inside = False
        for line in course.source(cell).splitlines():
            if line.strip().startswith("```"):
                inside = not inside
            elif inside:
                assert len(line) <= 90, f"lesson {lesson}, cell {i}: {len(line)} columns: {line[:50]}…"


def test_a_demonstration_gets_the_verdict_without_counting_as_an_attempt(tmp_path, monkeypatch):
    monkeypatch.setenv("ALLREDUCE_EDU_DATA_DIR", str(tmp_path))
    from allreduce_edu.exercises.lesson03 import check_busbw_answer

    assert "shrink to S/N" in check_busbw_answer.demo("a").message
    assert not (tmp_path / "progress.json").exists()
    assert not check_busbw_answer.demo("?").attempted
    assert not check_busbw_answer("a") and (tmp_path / "progress.json").exists()


def test_a_check_that_breaks_is_not_blamed_on_the_learner_nor_counted(tmp_path, monkeypatch):
    monkeypatch.setenv("ALLREDUCE_EDU_DATA_DIR", str(tmp_path))
    from allreduce_edu.exercises import lesson03

    def no_cluster(*args, **kwargs):
        raise RuntimeError("ranks [0, 1] did not start within 60 s")
    monkeypatch.setattr(lesson03, "Cluster", no_cluster)
    feedback = lesson03.check_ring_allreduce(reference("03.1"))
    assert not feedback and feedback.status == "check failed" and repr(feedback).startswith("⚠")
    assert "could not finish" in feedback.message and "not counted" in feedback.message
    assert not (tmp_path / "progress.json").exists()


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_scaffold_lines_fit_a_jupyterlab_column(exercise):
    _, cell = CELLS[exercise]
    assert all(len(line) <= 90 for line in course.source(cell).splitlines()), exercise


@pytest.mark.processes
@pytest.mark.parametrize("exercise, checker", [("02.1", "lesson02.check_naive_allreduce"),
                                               ("03.1", "lesson03.check_ring_allreduce"),
                                               ("07.1", "lesson07.check_fused")])
def test_the_process_checkers_accept_the_shared_memory_transport(exercise, checker, tmp_path, monkeypatch):
    monkeypatch.setenv("ALLREDUCE_EDU_DATA_DIR", str(tmp_path))
    import importlib
    module, name = checker.split(".")
    check = getattr(importlib.import_module(f"allreduce_edu.exercises.{module}"), name)
    feedback = check(reference(exercise), transport="shm")
    assert feedback and feedback.status == "passed", feedback.message
    assert "shm" in feedback.message or exercise != "07.1"
