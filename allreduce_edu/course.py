"""The lessons as files: which cells are exercises, and the instructor's key with every answer filled in.

An exercise cell carries `"exercise": "03.1"` in its metadata. In the committed lessons it is a scaffold
(its committed output is the checker's "not attempted yet"); `solved(nb)` puts each exercise's `key`
(registered beside its checker in allreduce_edu.exercises) in its place.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

LESSONS = Path(__file__).resolve().parent.parent / "lessons"  # the lessons of a clone (the source)
KEY = "exercise"  # the cell metadata field that names a cell's exercise


def lesson_files(folder: Path | None = None) -> list[Path]:
    """The numbered lessons, in order (00_welcome.ipynb, 01_..., ...)."""
    return sorted(p for p in Path(folder or LESSONS).glob("[0-9][0-9]_*.ipynb"))


def read(path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write(nb: dict, path) -> None:
    Path(path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def exercise_cells(nb: dict) -> dict[str, dict]:
    """{exercise id: its cell} for every exercise cell of a notebook."""
    cells = {}
    for cell in nb["cells"]:
        exercise = cell.get("metadata", {}).get(KEY)
        if exercise:
            if exercise in cells:
                raise ValueError(f"exercise {exercise} has two cells in one notebook")
            cells[exercise] = cell
    return cells


def source(cell: dict) -> str:
    text = cell.get("source", "")
    return "".join(text) if isinstance(text, list) else text


def set_source(cell: dict, text: str) -> None:
    lines = text.splitlines(keepends=True)
    cell["source"] = lines


def solved(nb: dict) -> dict:
    """A copy of `nb` with every exercise cell's scaffold replaced by its registered answer, outputs cleared."""
    from .exercises.registry import get

    nb = copy.deepcopy(nb)
    for exercise, cell in exercise_cells(nb).items():
        set_source(cell, get(exercise).key)
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    return nb


def execute(nb: dict, folder: Path, timeout: float = 300.0) -> dict:
    """Run every cell of `nb` in a fresh kernel with `folder` as its working directory; return it executed."""
    import nbclient
    import nbformat

    notebook = nbformat.from_dict(nb)
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
