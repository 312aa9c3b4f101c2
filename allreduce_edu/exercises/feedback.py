"""What every checker returns: passed (✓), failed with a hint (✗), or not attempted yet (○)."""

from __future__ import annotations

from dataclasses import dataclass

SYMBOLS = {"passed": "✓", "failed": "✗", "not attempted": "○", "check failed": "⚠"}


@dataclass(frozen=True)
class Feedback:
    """A checker's verdict; true only when the answer passed. Shows as `✓ ...`, `✗ ...` or
    `○ ...`."""

    passed: bool
    message: str
    status: str = ""  # passed | failed | not attempted | check failed (default: from `passed`)

    def __post_init__(self):
        if not self.status:
            object.__setattr__(self, "status", "passed" if self.passed else "failed")

    def __bool__(self) -> bool:
        return self.passed

    @property
    def attempted(self) -> bool:
        return self.status != "not attempted"

    def __repr__(self) -> str:
        return f"{SYMBOLS[self.status]} {self.message}"


def passed(message: str) -> Feedback:
    return Feedback(True, message)


def failed(message: str) -> Feedback:
    return Feedback(False, message)


def not_attempted(message: str) -> Feedback:
    return Feedback(False, f"not attempted yet: {message}", "not attempted")


def multiple_choice(choice, hints: dict[str, str], right: str, success: str) -> Feedback:
    """A multiple-choice answer: `right` passes with `success`; every other letter fails with its
    own hint."""
    choice = str(choice).strip().lower()
    if choice not in hints:
        letters = [repr(letter) for letter in sorted(hints)]
        return failed(f"answer with {', '.join(letters[:-1])} or {letters[-1]}.")
    return passed(success) if choice == right else failed(hints[choice])
