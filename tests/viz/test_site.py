"""`allreduce-edu site`: offline pages of the executed lessons, animations drawn by their own module,
hints folded and no solutions. (That the pages play in Chromium: tests/system/test_browser.py.)"""

from __future__ import annotations

import re

import pytest

from allreduce_edu import cli, course
from allreduce_edu.course.site import WIDGET_VIEW, build_site, static_notebook
from allreduce_edu.exercises import all_exercises


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return build_site(tmp_path_factory.mktemp("site"), ["03"])


def test_every_widget_output_becomes_a_drawing_that_needs_no_kernel():
    import nbformat

    [path] = [p for p in course.lesson_files() if p.name.startswith("03")]
    nb = nbformat.read(path, as_version=4)
    widgets = sum(WIDGET_VIEW in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    page = static_notebook(nb)
    assert widgets >= 2  # a still of step 0 and the animation
    assert not any(WIDGET_VIEW in o.get("data", {}) for c in page.cells for o in c.get("outputs", []))
    drawn = [o["data"]["text/html"] for c in page.cells for o in c.get("outputs", [])
             if "are-standalone" in o.get("data", {}).get("text/html", "")]
    assert len(drawn) == widgets
    assert "widgets" not in page.metadata  # the saved state would pull a widget manager from a CDN


def test_the_page_is_offline_with_hints_folded_and_no_solution(site):
    page = next(site.parent.glob("03_*.html")).read_text()
    scripts = re.findall(r"<script[^>]*src=\"([^\"]*)\"", page)
    assert scripts == []  # no script from anywhere: everything is inline
    assert "cdnjs" not in page and "unpkg" not in page
    exercises = {k: v for k, v in all_exercises().items() if k.startswith("03.")}
    assert len(exercises) >= 4 and "<details open" not in page
    for name, exercise in exercises.items():
        assert (f"for exercise {name}</summary>" in page) == bool(exercise.hints)
    assert "not attempted yet" in page


@pytest.mark.parametrize("lesson", [p.name[:2] for p in course.lesson_files()])
def test_the_page_adds_only_folded_hints(lesson):
    """No answer on a page: the committed lesson has none (tests/exercises/test_course.py), and the
    site adds only each exercise's hints, folded (the last hint of a ladder may come close to the
    answer, as `hint()` does in the notebook), never the solution."""
    import nbformat

    [path] = [p for p in course.lesson_files() if p.name.startswith(lesson)]
    nb = nbformat.read(path, as_version=4)
    page = static_notebook(nb)
    added = [c.source for c in page.cells if c.source not in {d.source for d in nb.cells}]
    known = all_exercises()
    names = list(course.exercise_cells(nb))
    assert len(added) == sum(bool(known[n].hints) for n in names)
    for name, text in zip([n for n in names if known[n].hints], added):
        assert text.count("<details>") == len(known[name].hints)
        assert known[name].solution.strip() not in text, f"{name}'s solution is on the page"


def test_the_index_links_every_page(site):
    index = site.read_text()
    assert index.count('<li class="lesson">') == 1 and 'href="03_ring_allreduce.html"' in index
    page = (site.parent / "03_ring_allreduce.html").read_text()
    # one lesson built: its page links back to the index, and to no page that was not built
    assert '<a rel="index" href="index.html">' in page
    assert 'rel="prev"' not in page and 'rel="next"' not in page


def test_the_command_builds_and_names_the_file_to_open(tmp_path, capsys):
    assert cli.main(["site", str(tmp_path / "s"), "--lesson", "00"]) == 0
    assert f"open {(tmp_path / 's' / 'index.html').resolve().as_uri()}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        cli.main(["site", str(tmp_path / "t"), "--lesson", "99"])
    assert exit_.value.code == 2 and "no lesson 99" in capsys.readouterr().err
