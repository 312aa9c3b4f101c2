"""A lesson that shows the library's source (`show_source`) shows it as the package has it now.

nbval catches a stale listing too, but only in the full run of every lesson; this reads the
committed outputs against the package's files in the everyday loop, in well under a second."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.ipynb"))


def shown_listings(notebook: Path) -> list[tuple[int, str, str]]:
    """(cell number, file, code) of every listing show_source printed into `notebook`."""
    found = []
    for number, cell in enumerate(json.loads(notebook.read_text(encoding="utf-8"))["cells"]):
        if cell["cell_type"] != "code" or "show_source(" not in "".join(cell["source"]):
            continue
        for output in cell.get("outputs", []):
            text = "".join(output.get("data", {}).get("text/plain", ""))
            head, _, code = text.partition("\n")
            if head.startswith("# allreduce_edu/"):
                found.append((number, head[2:], code))
    return found


def is_whole_block(code: str, text: str) -> bool:
    """`code` stands in `text` as a whole definition: present, and what follows it is not more
    of the same body (a listing whose function later grew would still be a prefix)."""
    at = text.find(code + "\n") if not text.endswith(code) else len(text) - len(code)
    if at < 0:
        return False
    first = code.splitlines()[0]
    indent = len(first) - len(first.lstrip())
    after = [line for line in text[at + len(code):].splitlines() if line.strip()]
    return not after or len(after[0]) - len(after[0].lstrip()) <= indent


def test_every_lesson_that_shows_source_is_checked_here():
    shown = [nb.name for nb in LESSONS if shown_listings(nb)]
    assert len(shown) >= 15, shown  # the parser still finds them: 16 lessons show source


@pytest.mark.parametrize("notebook", LESSONS, ids=lambda nb: nb.stem)
def test_shown_source_is_the_source_now(notebook):
    for number, where, code in shown_listings(notebook):
        text = (ROOT / where).read_text(encoding="utf-8")
        assert is_whole_block(code, text), (
            f"{notebook.name}, cell {number}: its listing of {where} is not what the file holds "
            f"now; re-execute the lesson (CONTRIBUTING.md: jupyter nbconvert --execute --inplace)")


def test_a_listing_that_grew_or_changed_is_caught():
    text = "def f(x):\n    return x\n\n\ndef g():\n    pass\n"
    assert is_whole_block("def f(x):\n    return x", text)
    assert is_whole_block("def g():\n    pass", text)
    assert not is_whole_block("def f(x):\n    return 2 * x", text)  # changed
    assert not is_whole_block("def f(x):", text)  # the body grew below what was shown
