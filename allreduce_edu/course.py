"""The lessons as files: each learner's own copy, which cells are exercises,
and the instructor's key.

`allreduce-edu lessons DIR` copies the lessons that ship inside the package into DIR and never
overwrites one the learner has changed: a manifest in DIR remembers what each copy looked like when
it was delivered. An exercise cell carries `"exercise": "03.1"` in its metadata; in the shipped
lessons it is a scaffold, and `solved(nb)` puts each exercise's `key` (registered beside its
checker in allreduce_edu.exercises) in its place.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .extras import skip_reason
from .unanswered import unanswered

KEY = "exercise"  # the cell metadata field that names a cell's exercise
# in a learner's folder: the hash of each lesson as delivered
MANIFEST = ".allreduce-edu-lessons.json"
DEFAULT_FOLDER = "allreduce-edu-lessons"
ENV_DATA = "ALLREDUCE_EDU_DATA_DIR"  # where checkers keep progress (exercises/progress.py)


def source_folder() -> Path:
    """Where the shipped lessons are: inside the installed package, or a clone's lessons/ folder."""
    here = Path(__file__).resolve().parent
    # a wheel's copy, then a clone's source
    for folder in (here / "lessons", here.parent / "lessons"):
        if any(folder.glob("[0-9][0-9]_*.ipynb")):
            return folder
    raise FileNotFoundError(f"no lessons found beside {here}: reinstall allreduce-edu")


def example_file(name: str) -> Path:
    """A script from examples/ (lesson 09 launches one): a clone's folder, else the wheel's copy."""
    here = Path(__file__).resolve().parent
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


def solved(nb: dict) -> dict:
    """A copy of `nb` with every exercise cell's scaffold replaced by its registered answer,
    outputs cleared."""
    from .exercises.registry import get

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


# --- a learner's own copy ------------------------------------------------------------------------
def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def as_delivered(source: Path) -> bytes:
    """The lesson as the learner gets it: no stored output answers a prediction (unanswered)."""
    return (json.dumps(unanswered(read(source)), indent=1, ensure_ascii=False) + "\n").encode()


@dataclass
class CopyReport:
    """What `copy_lessons` did with each lesson, by file name."""

    folder: Path
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # the learner changed them: left alone
    # ... and a newer lesson ships: --reset gives it
    kept_newer: list[str] = field(default_factory=list)
    fresh: list[str] = field(default_factory=list)  # --reset copies, beside the learner's

    def __str__(self) -> str:
        lines = [f"Lessons in {self.folder}:"]
        for names, what in ((self.added, "added"),
                            (self.updated, "updated to the installed version"),
                            (self.fresh, "fresh copies, beside yours"),
                            (self.kept, "left alone (you changed them)"),
                            (self.kept_newer, "left alone (you changed them; a newer version "
                                              "ships: --reset NN puts it beside yours)")):
            if names:
                lines.append(f"  {what}: {', '.join(names)}")
        if self.unchanged and not (self.added or self.updated):
            lines.append(f"  {len(self.unchanged)} lesson(s) already up to date")
        return "\n".join(lines)


def copy_lessons(folder, reset: list[str] = ()) -> CopyReport:
    """Copy the shipped lessons into `folder`: add missing ones, update ones the learner never
    changed, leave every changed one alone;
    `reset=["03"]` puts a fresh lesson 03 beside the learner's (never over it)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    manifest_path = folder / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        manifest = {}
    report = CopyReport(folder)
    sources = lesson_files()
    unknown = [n for n in reset if not any(p.name.startswith(f"{n}_") for p in sources)]
    if unknown:
        raise ValueError(f"no lesson {', '.join(unknown)}; "
                         f"lessons: {', '.join(p.name[:2] for p in sources)}")
    for source in sources:
        target, lesson = folder / source.name, as_delivered(source)
        shipped = hashlib.sha256(lesson).hexdigest()
        if not target.exists():
            target.write_bytes(lesson)
            manifest[source.name] = shipped
            report.added.append(source.name)
        elif _digest(target) == shipped:  # already the shipped lesson, whatever the manifest says
            report.unchanged.append(source.name)
            manifest[source.name] = shipped
        elif _digest(target) == manifest.get(source.name):  # as delivered: safe to update
            target.write_bytes(lesson)
            report.updated.append(source.name)
            manifest[source.name] = shipped
        else:
            newer = shipped != manifest.get(source.name)
            (report.kept_newer if newer else report.kept).append(source.name)
        if source.name[:2] in reset:
            fresh = _free_name(folder, source.stem + "_fresh")
            fresh.write_bytes(lesson)
            report.fresh.append(fresh.name)
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    _trust([folder / name for name in report.added + report.updated + report.unchanged
            + report.fresh])
    return report


def _trust(paths: list[Path]) -> None:
    """Mark lessons exactly as shipped trusted for this user (`jupyter trust`), so JupyterLab
    shows their saved output, animations included, before a cell runs. Never a learner's own."""
    import nbformat
    from nbformat.sign import NotebookNotary

    try:
        notary = NotebookNotary()
        for path in paths:
            notary.sign(nbformat.read(path, as_version=4))
    except Exception as e:  # noqa: BLE001 - no signature store here: lessons still open, untrusted
        print(f"(lessons not marked trusted: {type(e).__name__}: {e}; run `jupyter trust` on them "
              f"to see their animations before running)")


def _free_name(folder: Path, stem: str) -> Path:
    """folder/stem.ipynb, or stem2, stem3, ... if taken: a reset never overwrites anything."""
    path, k = folder / f"{stem}.ipynb", 1
    while path.exists():
        k += 1
        path = folder / f"{stem}{k}.ipynb"
    return path


def write_solved(folder, lessons: list[str] | None = None,
                 timeout: float = 300.0) -> list[tuple[str, list[str]]]:
    """The instructor's key: every lesson with its answers filled in, executed,
    written into `folder`.

    Returns (file name, problems, skipped) per lesson: problems lists cells that raised and
    checkers that did not pass; skipped says why a lesson was not run (an extra it needs is
    missing here: allreduce_edu.extras), else "".
    """
    folder = Path(folder)
    if (folder / MANIFEST).exists():
        raise ValueError(f"{folder} is a learner's lessons folder: write the key somewhere else")
    folder.mkdir(parents=True, exist_ok=True)
    results = []
    for path in lesson_files():
        if lessons and path.name[:2] not in lessons:
            continue
        nb = solved(read(path))
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
