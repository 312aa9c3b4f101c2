"""A learner's own copy of the lessons (`allreduce-edu lessons DIR`): lessons that are missing or
updated are added, one the learner changed is never overwritten (a manifest in DIR remembers what
each copy looked like when it was delivered), and no copy is ever left half written."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .files import MANIFEST, lesson_files, read
from .hide_answers import hide_answers


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def as_delivered(source: Path) -> bytes:
    """The lesson as the learner gets it: no stored output answers a prediction (hide_answers)."""
    return (json.dumps(hide_answers(read(source)), indent=1, ensure_ascii=False) + "\n").encode()


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
    # not a notebook (a copy cut short: disk full, Ctrl-C): the shipped lesson again
    repaired: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"Lessons in {self.folder}:"]
        for names, what in ((self.added, "added"),
                            (self.updated, "updated to the installed version"),
                            (self.fresh, "fresh copies, beside yours"),
                            (self.repaired, "repaired (they were not notebooks: a copy cut "
                                            "short)"),
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
            _write(target, lesson)
            manifest[source.name] = shipped
            report.added.append(source.name)
        elif _digest(target) == shipped:  # already the shipped lesson, whatever the manifest says
            report.unchanged.append(source.name)
            manifest[source.name] = shipped
        elif _digest(target) == manifest.get(source.name):  # as delivered: safe to update
            _write(target, lesson)
            report.updated.append(source.name)
            manifest[source.name] = shipped
        elif not _is_notebook(target):  # cut short by an earlier copy: nothing of yours in it
            _write(target, lesson)
            manifest[source.name] = shipped
            report.repaired.append(source.name)
        else:
            newer = shipped != manifest.get(source.name)
            (report.kept_newer if newer else report.kept).append(source.name)
        if source.name[:2] in reset:
            fresh = _free_name(folder, source.stem + "_fresh")
            _write(fresh, lesson)
            report.fresh.append(fresh.name)
    _write(manifest_path, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
    _trust([folder / name for name in report.added + report.updated + report.unchanged
            + report.fresh + report.repaired])
    return report


def _write(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all: into a temporary file beside it, then renamed over it
    (an interrupted copy leaves the old file, or none, never half a lesson)."""
    scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        scratch.write_bytes(data)
        scratch.replace(path)
    finally:
        scratch.unlink(missing_ok=True)


def _is_notebook(path: Path) -> bool:
    """Whether `path` reads as a notebook at all (JSON with cells), whatever is in it."""
    try:
        return isinstance(json.loads(path.read_bytes()).get("cells"), list)
    except (OSError, ValueError, AttributeError):
        return False


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
