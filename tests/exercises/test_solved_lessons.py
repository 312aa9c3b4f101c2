"""The instructor's key: every lesson, with every exercise answered, runs clean and every checker says ✓."""

from __future__ import annotations

import pytest

from allreduce_edu import course


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("lesson", [p.name[:2] for p in course.lesson_files()])
def test_solved_lesson_runs_with_every_checker_green(lesson, tmp_path):
    [(name, problems)] = course.write_solved(tmp_path, lessons=[lesson])
    assert problems == [], f"{name}: {problems}"
    solved = course.read(tmp_path / name)
    assert all(course.passed_or_needs_extra(course.feedback(c)) for c in course.exercise_cells(solved).values())
