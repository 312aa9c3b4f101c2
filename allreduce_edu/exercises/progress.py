"""Your progress through the course: a small JSON file the checkers update, shown by `progress()`.

The file lives in your user data directory (`allreduce-edu/progress.json` there), or in the folder
the environment variable ALLREDUCE_EDU_DATA_DIR names (the tests and CI point it at a temporary
folder).
"""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

ENV = "ALLREDUCE_EDU_DATA_DIR"
STATUSES = ("not started", "attempted", "passed")  # a status only ever moves right


def data_dir() -> Path:
    """Where allreduce-edu keeps your data: $ALLREDUCE_EDU_DATA_DIR, else your user data
    directory."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    import platformdirs

    return Path(platformdirs.user_data_dir("allreduce-edu", appauthor=False))


def progress_file() -> Path:
    return data_dir() / "progress.json"


def load() -> dict[str, dict]:
    """{exercise id: {"status": ..., "attempts": n, "when": unix time}, "predictions": {...}};
    empty when nothing is recorded."""
    try:
        data = json.loads(progress_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record(exercise: str, status: str) -> None:
    """Count an attempt at `exercise`; its status only moves forward (attempted, then passed), and
    checks after a pass (trying a variant, re-running the cell) are not tries."""
    def count(data: dict) -> None:
        entry = data.get(exercise, {})
        old = entry.get("status", "not started")
        if old == "passed":
            return
        best = max(old, status, key=lambda s: STATUSES.index(s) if s in STATUSES else 0)
        data[exercise] = {"status": best, "attempts": int(entry.get("attempts", 0)) + 1,
                          "when": round(time.time())}
    _update(count)


PREDICTIONS = "predictions"  # the file's entry for your guesses: {key: {"value": ..., ...}}


def record_prediction(key: str, **fields) -> None:
    """Store fields (value, measured, said, model) of prediction `key`, keeping the others it
    has."""
    def store(data: dict) -> None:
        guesses = data.get(PREDICTIONS) if isinstance(data.get(PREDICTIONS), dict) else {}
        guesses[key] = {**guesses.get(key, {}), **fields, "when": round(time.time())}
        data[PREDICTIONS] = guesses
    _update(store)


def predictions() -> dict[str, dict]:
    """{key: {"value": your guess, "measured": ..., "said": where that came from, "model": ...}},
    as recorded."""
    found = load().get(PREDICTIONS)
    return found if isinstance(found, dict) else {}


def _update(change) -> None:
    """Apply change(data) to the progress file, under its lock, whole or not at all."""
    path = progress_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "w") as lock:  # two notebooks at once: in turn
            _lock(lock)
            data = load()
            change(data)
            scratch = path.with_suffix(f".{os.getpid()}.tmp")
            scratch.write_text(json.dumps(data, indent=1, sort_keys=True))
            scratch.replace(path)  # whole or not at all
    except OSError as e:  # a read-only home must not break a checker
        warnings.warn(f"allreduce-edu could not save your progress to {path}: {e}", stacklevel=4)


def _lock(file) -> None:
    """Hold an exclusive lock on `file` until it closes (where the platform has flock)."""
    try:
        import fcntl
    except ImportError:  # Windows: one notebook at a time is the common case
        return
    fcntl.flock(file, fcntl.LOCK_EX)


def reset() -> None:
    """Forget every recorded attempt (deletes the progress file)."""
    progress_file().unlink(missing_ok=True)
