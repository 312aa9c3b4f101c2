"""Optional extras: a lesson cell that needs one missing here is skipped with the reason, never run
to a different output, and never a failure (allreduce_edu.course.extras, the repository's conftest.py)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from allreduce_edu import course
from allreduce_edu.course import extras

ROOT = Path(__file__).resolve().parents[1]


def test_a_missing_module_is_named_with_its_install_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert extras.why_missing("torch") == 'needs torch: pip install -e ".[torch]" (the CPU build is enough)'
    assert extras.why_missing("mpi").startswith('needs mpi: pip install -e ".[mpi]"')
    with pytest.raises(ValueError, match="unknown extra 'tensorflow'; valid: torch, mpi, gpu, cuda"):
        extras.why_missing("tensorflow")


def test_the_notebooks_and_the_cells_requirements_add_up(monkeypatch):
    monkeypatch.setattr(extras, "why_missing", lambda extra: "" if extra == "mpi" else f"needs {extra}")
    notebook, cell = {"allreduce_edu": {"requires": ["torch"]}}, {"allreduce_edu": {"requires": ["mpi", "gpu"]}}
    assert extras.skip_reason({}, {}) == ""
    assert extras.skip_reason(notebook, {}) == "needs torch"
    assert extras.skip_reason({}, cell) == "needs gpu"
    assert extras.skip_reason(notebook, cell) == "needs torch; needs gpu"


def test_every_lesson_cell_that_uses_an_extra_says_so():
    """A cell that branches on whether torch, MPI or a GPU is here carries the metadata that skips it."""
    asks = ("torch_ready():", 'missing("mpi"):', 'missing("gloo"):', "gpu.simulated():", 'find_spec("torch"):')
    unmarked = []
    for path in course.lesson_files():
        nb = course.read(path)
        for i, cell in enumerate(nb["cells"]):
            if cell["cell_type"] == "code" and any(a in course.source(cell) for a in asks) \
                    and not extras.requirements(nb["metadata"]) + extras.requirements(cell["metadata"]):
                unmarked.append(f"{path.name} cell {i}")
    assert not unmarked, f"cells that need an extra without saying so: {unmarked}"


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None,
                    reason="torch is installed here: .ci/run's first pass (no extras) runs this")
def test_lesson_13_without_torch_is_skipped_item_by_item_with_the_reason():
    nb = json.loads((ROOT / "lessons" / "13_pytorch.ipynb").read_text())
    code_cells = sum(c["cell_type"] == "code" for c in nb["cells"])
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-ra", "-q",
                          "lessons/13_pytorch.ipynb"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-3000:]
    assert f"SKIPPED [{code_cells}] lessons/13_pytorch.ipynb: needs torch" in run.stdout, run.stdout[-3000:]
    assert " passed" not in run.stdout and "failed" not in run.stdout
