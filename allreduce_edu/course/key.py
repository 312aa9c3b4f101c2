"""The instructor's key: `solved(nb)` puts each exercise's `key` (registered beside its checker in
allreduce_edu.exercises) in place of its scaffold; `write_solved` executes every lesson so."""

from __future__ import annotations

import copy
import json
import os
import tempfile
from pathlib import Path

from .extras import skip_reason
from .files import ENV_DATA, MANIFEST, exercise_cells, lesson_files, read, set_source, write


def solved(nb: dict) -> dict:
    """A copy of `nb` with every exercise cell's scaffold replaced by its registered answer,
    outputs cleared."""
    from ..exercises.registry import get

    nb = copy.deepcopy(nb)
    for exercise, cell in exercise_cells(nb).items():
        set_source(cell, get(exercise).key)
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    return nb


def execute(nb: dict, folder: Path, timeout: float = 300.0) -> dict:
    """Run every cell of `nb` in a fresh kernel with `folder` as its working directory;
    return it executed."""
    import nbclient
    import nbformat

    # sources as strings, as nbclient wants them
    notebook = nbformat.reads(json.dumps(nb), as_version=4)
    nbclient.NotebookClient(notebook, timeout=timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(folder)}}).execute()
    return json.loads(nbformat.writes(notebook))


def errors(nb: dict) -> list[str]:
    """'cell 12: NameError: ...' for every cell that raised."""
    found = []
    for i, cell in enumerate(nb["cells"]):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                found.append(f"cell {i}: {out.get('ename')}: {out.get('evalue')}")
    return found


def feedback(cell: dict) -> str:
    """The text an exercise cell printed or showed (its checker's verdict)."""
    parts = []
    for out in cell.get("outputs", []):
        text = out.get("text", "") or out.get("data", {}).get("text/plain", "")
        parts.append("".join(text) if isinstance(text, list) else text)
    return "".join(parts)


def write_solved(folder, lessons: list[str] | None = None,
                 timeout: float = 300.0) -> list[tuple[str, list[str]]]:
    """The instructor's key: every lesson with its answers filled in, executed,
    written into `folder`.

    Returns (file name, problems, skipped) per lesson: problems lists cells that raised and
    checkers that did not pass; skipped says why a lesson was not run (an extra it needs is
    missing here: allreduce_edu.course.extras), else "".
    """
    folder = Path(folder)
    if (folder / MANIFEST).exists():
        raise ValueError(f"{folder} is a learner's lessons folder: write the key somewhere else")
    folder.mkdir(parents=True, exist_ok=True)
    results = []
    for path in lesson_files():
        if lessons and path.name[:2] not in lessons:
            continue
        nb = _runnable_here(solved(read(path)))
        skipped = skip_reason(nb["metadata"])
        if skipped:
            results.append((path.name, [], skipped))
            continue
        with tempfile.TemporaryDirectory(prefix="allreduce-edu-key-") as scratch:
            nb = _executed_elsewhere(nb, folder, timeout, scratch)
        write(nb, folder / path.name)
        problems = errors(nb) + [f"exercise {ex}: "
                                 f"{feedback(cell).strip()[:200] or 'no verdict shown'}"
                                 for ex, cell in exercise_cells(nb).items()
                                 if not passed_or_needs_extra(feedback(cell))
                                 and not skip_reason(nb["metadata"], cell.get("metadata", {}))]
        results.append((path.name, problems, ""))
    return results


def _runnable_here(nb: dict) -> dict:
    """Cells that need an extra this machine lacks print why instead of running (as nbval skips
    them: allreduce_edu.course.extras), so the key of lesson 14 runs on a Mac without numba-cuda."""
    for cell in nb["cells"]:
        why = cell["cell_type"] == "code" and skip_reason(nb["metadata"], cell.get("metadata", {}))
        if why:
            set_source(cell, f"print({'skipped here: ' + why!r})")
    return nb


def passed_or_needs_extra(shown: str) -> bool:
    """A key's checker passed (✓), or says it needs an extra this machine lacks (⚠ needs ...)."""
    return shown.lstrip().startswith(("✓", "⚠ needs "))


def _executed_elsewhere(nb: dict, folder: Path, timeout: float, data_dir: str) -> dict:
    """Execute `nb` with its checkers' progress in `data_dir`: the key's ✓ are not yours."""
    before = os.environ.get(ENV_DATA)
    os.environ[ENV_DATA] = data_dir  # the kernel inherits this process's environment
    try:
        return execute(nb, folder, timeout)
    finally:
        if before is None:
            os.environ.pop(ENV_DATA, None)
        else:
            os.environ[ENV_DATA] = before
