"""`allreduce-edu lessons`: each learner's own copy of the lessons, never overwritten; the wheel carries them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from allreduce_edu import course
from allreduce_edu.cli import main
from allreduce_edu.course.hide_answers import PREDICT, answer_spans

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [p.name for p in course.lesson_files()]


def test_the_lessons_a_clone_ships_are_its_lessons_folder():
    assert course.source_folder() == ROOT / "lessons"
    assert SHIPPED[0] == "00_welcome.ipynb" and len(SHIPPED) >= 10


def test_copy_adds_then_leaves_changed_lessons_alone(tmp_path, capsys):
    folder = tmp_path / "mine"
    assert main(["lessons", str(folder), "--no-lab"]) == 0
    assert sorted(p.name for p in folder.glob("*.ipynb")) == SHIPPED
    assert "added: 00_welcome.ipynb" in capsys.readouterr().out
    mine = folder / "03_ring_allreduce.ipynb"
    nb = course.read(mine)
    nb["cells"][0]["source"] = ["my own notes\n"]
    course.write(nb, mine)
    (folder / "01_ranks_and_messages.ipynb").unlink()
    assert main(["lessons", str(folder), "--no-lab"]) == 0
    out = capsys.readouterr().out
    assert "added: 01_ranks_and_messages.ipynb" in out
    assert "left alone (you changed them): 03_ring_allreduce.ipynb" in out
    assert course.read(mine)["cells"][0]["source"] == ["my own notes\n"]


def test_reset_puts_a_fresh_copy_beside_never_over(tmp_path, capsys):
    folder = tmp_path / "mine"
    course.copy_lessons(folder)
    mine = folder / "03_ring_allreduce.ipynb"
    mine.write_text(mine.read_text().replace("ring", "RING", 1))
    changed = mine.read_bytes()
    for _ in range(2):
        assert main(["lessons", str(folder), "--no-lab", "--reset", "03"]) == 0
    assert mine.read_bytes() == changed
    fresh = [folder / "03_ring_allreduce_fresh.ipynb", folder / "03_ring_allreduce_fresh2.ipynb"]
    shipped = course.as_delivered(ROOT / "lessons/03_ring_allreduce.ipynb")
    assert all(p.read_bytes() == shipped for p in fresh)
    assert "fresh copies, beside yours: 03_ring_allreduce_fresh2.ipynb" in capsys.readouterr().out


def test_unchanged_lessons_follow_a_newer_release_changed_ones_do_not(tmp_path):
    folder = tmp_path / "mine"
    course.copy_lessons(folder)
    manifest = json.loads((folder / course.MANIFEST).read_text())
    for name, text in (("02_naive_allreduce.ipynb", "an older release"), ("04_tree_allreduce.ipynb", "older")):
        (folder / name).write_text(text)  # as an older release delivered it ...
        manifest[name] = course._digest(folder / name)
    (folder / course.MANIFEST).write_text(json.dumps(manifest))
    learners = json.dumps({"cells": [], "note": "older, then changed by the learner"})  # still a notebook
    (folder / "04_tree_allreduce.ipynb").write_text(learners)
    report = course.copy_lessons(folder)
    assert report.updated == ["02_naive_allreduce.ipynb"]
    assert (folder / "02_naive_allreduce.ipynb").read_bytes() == course.as_delivered(ROOT / "lessons/02_naive_allreduce.ipynb")
    assert report.kept_newer == ["04_tree_allreduce.ipynb"]
    assert (folder / "04_tree_allreduce.ipynb").read_text() == learners


def test_bad_reset_is_a_one_line_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        main(["lessons", str(tmp_path), "--no-lab", "--reset", "77"])
    assert exit.value.code == 2
    assert "no lesson 77" in capsys.readouterr().err


def _wait_for_lab(proc, port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=1):
                return
        except OSError as e:
            if getattr(e, "code", None) == 403:  # up, and asking for its token
                return
            time.sleep(0.5)
    raise AssertionError("JupyterLab did not come up")


def _clean_copy(target: Path) -> Path:
    """The repository's files as they are now, without build leftovers (a stale build/ would ship)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            text=True)
    if listed.returncode:
        return ROOT  # not a git checkout (an unpacked sdist, say): build it as it is
    for name in listed.stdout.splitlines():
        if (ROOT / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)
    return target


@pytest.mark.slow
def test_a_wheel_installed_outside_the_repository_lays_out_lessons_that_run(tmp_path):
    """As a learner with an instructor's wheel: install it in a fresh venv, get the lessons, run lesson 00."""
    home = tmp_path / "home"  # far from the repository: nothing there to find by accident
    home.mkdir()
    venv = tmp_path / "learner-venv"
    env = dict(os.environ, PATH=f"{venv / 'bin'}:{os.environ['PATH']}", JUPYTER_PLATFORM_DIRS="1",
               HOME=str(home), PYTHONNOUSERSITE="1")
    env.pop("PYTHONPATH", None)  # a path to a checkout would make pip think the package is installed
    pip_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # ... and pip keeps its cache
    wheels, source = tmp_path / "wheels", _clean_copy(tmp_path / "source")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(source)],
                   check=True, timeout=600, env=pip_env, cwd=tmp_path)
    wheel = next(wheels.glob("allreduce_edu-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=pip_env)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True, timeout=1200,
                   env=pip_env, cwd=tmp_path)
    port = 20000 + os.getpid() % 20000
    lab = subprocess.Popen([str(venv / "bin" / "allreduce-edu"), "lessons", "course", "--no-browser",
                            "--port", str(port)], cwd=home, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for_lab(lab, port, time.monotonic() + 120)
    finally:
        lab.terminate()
        lab.wait(30)
    folder = home / "course"
    assert sorted(p.name for p in folder.glob("*.ipynb")) == SHIPPED
    where = subprocess.run([str(py), "-c", "import allreduce_edu.course as c; print(c.source_folder())"],
                           cwd=home, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(venv)), where  # the wheel's own copy, not this repository's
    for lesson in ("00_welcome", "01_ranks_and_messages"):  # 01 shows rank.proto: the wheel carries it
        ran = subprocess.run([str(venv / "bin" / "jupyter"), "nbconvert", "--to", "notebook", "--execute",
                              "--output", f"{lesson}_ran.ipynb", str(folder / f"{lesson}.ipynb")], cwd=home,
                             env=env, capture_output=True, text=True, timeout=600)
        assert ran.returncode == 0, ran.stderr[-3000:]
        assert not course.errors(course.read(folder / f"{lesson}_ran.ipynb"))
    mine = folder / "00_welcome.ipynb"
    nb = course.read(mine)
    nb["cells"][0]["source"] = ["# my notes\n"]
    course.write(nb, mine)
    again = subprocess.run([str(venv / "bin" / "allreduce-edu"), "lessons", "course", "--no-lab"], cwd=home,
                           env=env, capture_output=True, text=True, check=True)
    assert "left alone (you changed them): 00_welcome.ipynb" in again.stdout
    assert course.read(mine)["cells"][0]["source"] == ["# my notes\n"]


def test_a_copy_equal_to_the_shipped_lesson_is_up_to_date_whatever_the_manifest_says(tmp_path):
    folder = tmp_path / "mine"
    course.copy_lessons(folder)
    manifest = json.loads((folder / course.MANIFEST).read_text())
    manifest["03_ring_allreduce.ipynb"] = "0" * 64  # an older release's digest
    (folder / course.MANIFEST).write_text(json.dumps(manifest))
    report = course.copy_lessons(folder)
    assert "03_ring_allreduce.ipynb" in report.unchanged and not report.kept_newer
    assert course.copy_lessons(folder).kept_newer == []


def test_the_key_is_never_written_over_a_learners_folder(tmp_path, capsys):
    course.copy_lessons(tmp_path / "mine")
    with pytest.raises(SystemExit) as exit:
        main(["lessons", "--solved", str(tmp_path / "mine")])
    assert exit.value.code == 2 and "learner's lessons folder" in capsys.readouterr().err
    with pytest.raises(ValueError, match="learner's lessons folder"):
        course.write_solved(tmp_path / "mine")


@pytest.mark.processes
def test_the_key_keeps_its_checks_out_of_the_instructors_progress(tmp_path, monkeypatch):
    monkeypatch.setenv("ALLREDUCE_EDU_DATA_DIR", str(tmp_path / "instructor"))
    [(name, problems, skipped)] = course.write_solved(tmp_path / "key", lessons=["00"])
    assert problems == [] and skipped == "" and name == "00_welcome.ipynb"
    assert not (tmp_path / "instructor" / "progress.json").exists()


def test_the_shipped_lessons_are_trusted_a_learners_own_are_not(tmp_path, monkeypatch):
    """Trusted, JupyterLab shows a lesson's saved animations before any cell runs; a lesson the
    learner changed is theirs to trust."""
    import nbformat
    from nbformat.sign import NotebookNotary

    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter"))  # a signature store of our own
    folder = tmp_path / "mine"
    course.copy_lessons(folder)
    notary = NotebookNotary()
    assert all(notary.check_signature(nbformat.read(p, as_version=4)) for p in folder.glob("*.ipynb"))
    mine = folder / "03_ring_allreduce.ipynb"
    nb = nbformat.read(mine, as_version=4)
    nb.cells[0].source = "my own notes"
    nbformat.write(nb, mine)
    course.copy_lessons(folder)  # left alone, and not signed on the learner's behalf
    assert not notary.check_signature(nbformat.read(mine, as_version=4))


@pytest.mark.parametrize("name", SHIPPED)
def test_the_learners_copy_shows_no_answer_to_a_prediction_before_it_is_made(tmp_path, name):
    """Committed executed, a lesson shows the measurement below its prediction cell; the copy a
    learner gets clears every code cell's output from the prediction to the cell that compares it."""
    shipped = course.read(ROOT / "lessons" / name)
    for key, (start, end) in answer_spans(shipped).items():
        assert any(c.get("outputs") for c in shipped["cells"][start + 1:end + 1]), key  # answered there
    course.copy_lessons(tmp_path)
    mine = course.read(tmp_path / name)
    for key, (start, end) in answer_spans(mine).items():
        for cell in mine["cells"][start + 1:end + 1]:
            if cell["cell_type"] == "code" and course.KEY not in cell["metadata"]:
                assert cell["outputs"] == [], (key, course.source(cell)[:60])
    exercises, theirs = course.exercise_cells(mine), course.exercise_cells(shipped)
    assert all(exercises[k]["outputs"] == theirs[k]["outputs"] for k in theirs)  # "not attempted"
    assert [c["source"] for c in mine["cells"]] == [c["source"] for c in shipped["cells"]]


def test_every_prediction_in_a_lesson_is_compared_by_a_later_cell():
    for name in SHIPPED:
        nb = course.read(ROOT / "lessons" / name)
        keys = {k for c in nb["cells"] if c["cell_type"] == "code" for k in PREDICT.findall(course.source(c))}
        assert keys == set(answer_spans(nb)), (name, keys - set(answer_spans(nb)))
        assert all(re.fullmatch(r"\d\d\.[a-z]", k) for k in keys), keys
