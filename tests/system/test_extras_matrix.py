"""The extras matrix (issue 36): a learner may have none of the optional engines, torch only, MPI
only, or both, and in each every lesson must pass nbval, no cell leaning on one that was skipped.

The lessons whose notebook or cells declare torch or MPI (their metadata, allreduce_edu.course.
extras) run under nbval in each combination this machine can make: an extra that is installed is
hidden from every Python of the run (a sitecustomize on PYTHONPATH makes `import torch` fail, as
where it was never installed); one that is not installed cannot be shown, and that combination
skips saying so. A lesson sees only the engines it declares (the last test checks that no cell
reaches one it does not declare), so each lesson runs in the combinations made of its own engines
alone: lesson 13, which declares torch, with none and with torch, not again with MPI beside them.
Every other lesson reaches no extra, so its single nbval run in the README's test command stands
for every combination; so does that run for "none" where neither extra is installed."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from allreduce_edu.course.extras import EXTRAS, requirements

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.ipynb"))
ENGINES = ("torch", "mpi")  # the extras a learner installs or not; cuda and gpu are the machine's
COMBINATIONS = {"none": (), "torch only": ("torch",), "mpi only": ("mpi",), "both": ENGINES}

pytestmark = [pytest.mark.processes, pytest.mark.timeout(900)]  # two lessons under nbval a test


def _declared(notebook: dict) -> set[str]:
    cells = [requirements(c.get("metadata")) for c in notebook["cells"]]
    return set(requirements(notebook.get("metadata"))).union(*cells)


def _engine_lessons() -> list[Path]:
    return [p for p in LESSONS if _declared(json.loads(p.read_text())) & set(ENGINES)]


def _installed(extra: str) -> bool:
    return importlib.util.find_spec(EXTRAS[extra][0]) is not None


def _hiding(folder: Path, modules: list[str]) -> Path:
    """A folder whose sitecustomize makes `modules` fail to import, then runs the sitecustomize
    behind it (the macOS cut, where one is on PYTHONPATH)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(textwrap.dedent(f"""\
        import importlib, os, sys
        for name in {modules!r}:
            sys.modules[name] = None  # ModuleNotFoundError, as where it was never installed
        here = os.path.dirname(os.path.abspath(__file__))
        own = sys.modules.pop("sitecustomize", None)
        saved = sys.path[:]
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        try:
            importlib.import_module("sitecustomize")
        except ModuleNotFoundError:
            sys.modules["sitecustomize"] = own  # site's import of this one ends as it began
        finally:
            sys.path[:] = saved
        """))
    return folder


def test_the_lessons_that_use_an_engine_say_so():
    assert [p.name[:2] for p in _engine_lessons()] == ["09", "13"]


@pytest.mark.parametrize("combination", list(COMBINATIONS))
def test_the_engine_lessons_pass_nbval_with_every_combination_of_extras(combination, tmp_path):
    shown = COMBINATIONS[combination]
    absent = [e for e in shown if not _installed(e)]
    if absent:
        pytest.skip(f"{combination}: {', '.join(absent)} is not installed here, so it cannot be "
                    f"shown (.ci/run's third pass installs the extras)")
    if not shown and not any(map(_installed, ENGINES)):
        pytest.skip("none: neither extra is installed here, so the README's test command's own "
                    "nbval run of lessons/ is this combination")
    lessons = [p for p in _engine_lessons() if set(shown) <= _declared(json.loads(p.read_text()))]
    if not lessons:  # (pytest given no path would run the whole suite)
        pytest.skip(f"{combination}: no lesson declares all of it")
    hidden = [EXTRAS[e][0] for e in ENGINES if e not in shown]
    env = dict(os.environ, ALLREDUCE_EDU_DATA_DIR=str(tmp_path / "data"), PYTHONPATH=os.pathsep.join(
        [str(_hiding(tmp_path / "hide", hidden)), *filter(None, [os.environ.get("PYTHONPATH")])]))
    probe = subprocess.run([sys.executable, "-c", "import importlib.util as u; print("
                            "[m for m in ('torch', 'mpi4py') if u.find_spec(m)])"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip() == repr([EXTRAS[e][0] for e in shown])
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE",
                           *map(str, lessons)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, f"with {combination}:\n{done.stdout[-6000:]}\n{done.stderr[-2000:]}"


#: what reaches each engine in a cell's source; ENGINE_CALLS reaches one named by a variable
USES = {"torch": re.compile(r"^\s*(import|from)\s+torch\b|\bTorchCommunicator\b|[\"']gloo[\"']", re.M),
        "mpi": re.compile(r"^\s*(import|from)\s+mpi4py\b|\bMPICommunicator\b|[\"']mpi[\"']", re.M)}
ENGINE_CALLS = re.compile(r"\b(run_on_engine|engine=)")


def _code(notebook: dict) -> list[str]:
    return ["".join(c["source"]) if c["cell_type"] == "code" else "" for c in notebook["cells"]]


@pytest.mark.parametrize("lesson", [p for p in LESSONS if p not in _engine_lessons()],
                         ids=lambda p: p.name[:2])
def test_a_lesson_that_declares_no_engine_reaches_none(lesson):
    reaching = [i for i, source in enumerate(_code(json.loads(lesson.read_text())))
                if ENGINE_CALLS.search(source) or any(use.search(source) for use in USES.values())]
    assert not reaching, f"{lesson.name}: cells {reaching} reach torch or MPI but declare no extra"


@pytest.mark.parametrize("lesson", _engine_lessons(), ids=lambda p: p.name[:2])
def test_an_engine_lesson_reaches_only_the_engines_it_declares(lesson):
    """What lets the matrix run lesson 13 (torch) without MPI's combinations."""
    notebook = json.loads(lesson.read_text())
    reached = {engine for engine, use in USES.items() if any(map(use.search, _code(notebook)))}
    assert reached <= _declared(notebook), f"{lesson.name} reaches {reached - _declared(notebook)} " \
                                           f"but declares only {_declared(notebook)}"
