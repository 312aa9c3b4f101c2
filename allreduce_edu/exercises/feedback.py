"""What every checker returns: passed (✓), failed with a hint (✗), or not attempted yet (○)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

WIDTH = 90  # a notebook column at 1280 px, file browser open: longer lines break mid-word


def wrap(text: str) -> str:
    """`text` in lines of at most WIDTH columns, broken between words, paragraph by paragraph."""
    return "\n".join(textwrap.fill(line, WIDTH, break_long_words=False, break_on_hyphens=False)
                     for line in text.splitlines())


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
        return wrap(f"{SYMBOLS[self.status]} {self.message}")


def passed(message: str) -> Feedback:
    return Feedback(True, message)


def failed(message: str) -> Feedback:
    return Feedback(False, message)


def not_attempted(message: str) -> Feedback:
    return Feedback(False, f"not attempted yet: {message}", "not attempted")

