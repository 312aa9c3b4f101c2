"""The exercises' prose, one data file per lesson beside its checkers: lessonNN.toml holds, under
each exercise's id, its title, question, options, hints, slip hints, solution and messages, with
`{placeholders}` where a message shows a number the checker computes.

    [ "03.4" ]
    checker = "check_busbw_answer"
    title = "the ring on 64 ranks instead of 8"
    hints = ["...", "..."]

The Python beside it holds the checkers, the computed values and the names of things only.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

HERE = Path(__file__).resolve().parent


@functools.cache
def lesson(name: str) -> dict[str, dict]:
    """Every exercise's texts of lesson `name` ("lesson03", or its module's dotted name), by id."""
    path = HERE / f"{name.rsplit('.', 1)[-1]}.toml"
    if not path.exists():
        return {}
    with path.open("rb") as f:
        return tomllib.load(f)


def exercise_texts(module: str, id: str) -> dict:
    """The texts of exercise `id`, from the data file of the lesson module `module` ({} if none)."""
    return lesson(module).get(id, {})


def fill(template: str, values: dict) -> str:
    """A message with its {placeholders} filled in from `values`."""
    return template.format(**values)


def message(module: str, id: str, name: str, /, **values) -> str:
    """A checker's message `name` for exercise `id` (the data file's [ "NN.M".messages ] name =
    "..."), its {placeholders} filled in from `values`."""
    return fill(exercise_texts(module, id)["messages"][name], values)
