"""What every checker returns, and where solutions live until a learner asks for one."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

SOLUTIONS: dict[str, str] = {}  # "03.1" -> the solution's text; each lesson module adds its own


@dataclass(frozen=True)
class Feedback:
    """A checker's verdict: true when the answer passed; shown in a notebook as ✓ or ✗ and a hint."""

    passed: bool
    message: str

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return ("✓ " if self.passed else "✗ ") + self.message


def passed(message: str) -> Feedback:
    return Feedback(True, message)


def failed(message: str) -> Feedback:
    return Feedback(False, message)


def multiple_choice(choice, hints: dict[str, str], right: str, success: str) -> Feedback:
    """A multiple-choice answer: `right` passes with `success`; every other letter fails with its own hint."""
    choice = str(choice).strip().lower()
    if choice not in hints:
        letters = [repr(letter) for letter in sorted(hints)]
        return failed(f"answer with {', '.join(letters[:-1])} or {letters[-1]}.")
    return passed(success) if choice == right else failed(hints[choice])


def solution(exercise: str) -> None:
    """Print the solution of an exercise, e.g. solution("03.1")."""
    if exercise not in SOLUTIONS and exercise[:2].isdigit():  # its lesson's module registers it on import
        try:
            importlib.import_module(f"allreduce_edu.exercises.lesson{exercise[:2]}")
        except ImportError:
            pass
    if exercise not in SOLUTIONS:
        raise KeyError(f"no exercise {exercise!r}; known: {', '.join(sorted(SOLUTIONS))}")
    print(SOLUTIONS[exercise])
