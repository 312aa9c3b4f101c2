"""The lessons as files: where the shipped ones are, reading and writing a notebook, which cells
are exercises (an exercise cell carries `"exercise": "03.1"` in its metadata)."""

from __future__ import annotations

import json
from pathlib import Path

KEY = "exercise"  # the cell metadata field that names a cell's exercise
# in a learner's folder: the hash of each lesson as delivered
MANIFEST = ".allreduce-edu-lessons.json"
DEFAULT_FOLDER = "allreduce-edu-lessons"
ENV_DATA = "ALLREDUCE_EDU_DATA_DIR"  # where checkers keep progress (exercises/progress.py)


def source_folder() -> Path:
    """Where the shipped lessons are: inside the installed package, or a clone's lessons/ folder."""
    here = Path(__file__).resolve().parents[1]  # the package: allreduce_edu/
    # a wheel's copy, then a clone's source
    for folder in (here / "lessons", here.parent / "lessons"):
        if any(folder.glob("[0-9][0-9]_*.ipynb")):
            return folder
    raise FileNotFoundError(f"no lessons found beside {here}: reinstall allreduce-edu")


def example_file(name: str) -> Path:
    """A script from examples/ (lesson 09 launches one): a clone's folder, else the wheel's copy."""
    here = Path(__file__).resolve().parents[1]  # the package: allreduce_edu/
    for path in (here.parent / "examples" / name, here / "examples" / name):
        if path.exists():
            return path
    raise FileNotFoundError(f"no example {name!r} beside {here}: reinstall allreduce-edu")


def lesson_files(folder: Path | None = None) -> list[Path]:
    """The numbered lessons, in order (00_welcome.ipynb, 01_..., ...)."""
    return sorted(p for p in Path(folder or source_folder()).glob("[0-9][0-9]_*.ipynb"))


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
