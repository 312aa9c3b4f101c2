"""The README's promises, run as written: the ten-line example and the two commands' shape."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from allreduce_edu import course
from allreduce_edu.course import site_index

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


@pytest.mark.processes
def test_the_ten_lines_run_as_they_are(capsys):
    section = README[README.index("## In ten lines"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)[1]
    exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})  # noqa: S102 - our own README
    out = capsys.readouterr().out
    assert "[array([2.5, 2.5, 2.5, 2.5])" in out  # (1 + 2 + 3 + 4) / 4 on every rank
    assert "Trace(" in out or "rank 0 →" in out


def test_the_two_commands_are_a_fresh_setup_each():
    commands = re.findall(r"```bash\n# .*\n(python3 -m venv .*)\n```", README)
    assert commands[0].endswith("pip install -e . && allreduce-edu lessons")
    assert commands[1].endswith('pip install -e ".[test]" && python -m pytest -ra')
    assert "python -m pytest -p no:cacheprovider -ra" in (ROOT / ".ci" / "run").read_text()


def test_the_lesson_table_gives_each_lessons_time_as_its_header_does():
    """One learner's time per lesson: the header states it, the README's table and the site's index
    repeat it (the site reads the header itself)."""
    for path in course.lesson_files():
        header = next(c.source for c in nbformat.read(path, as_version=4).cells
                      if c.cell_type == "markdown")
        row = re.search(rf"\(lessons/{re.escape(path.name)}\).*\|\s*([^|]+?)\s*\|\s*$", README, re.M)
        assert row, f"the README's lesson table has no row for {path.name}"
        assert row[1] == site_index.header_time(header), path.name
