"""A lesson that shows the library's source (`show_source`) shows it as the package has it now.

nbval catches a stale listing printed as text, but only in the full run of every lesson, and one
folded into HTML not at all (it compares the text/plain "<HTML object>"); this reads the committed
outputs against the package's files in the everyday loop, in well under a second."""

from __future__ import annotations

import ast
import html
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.ipynb"))
# Source._repr_html_: the file, then the highlighted code (a lesson may fold it into its own HTML)
HTML_LISTING = re.compile(
    r"<small><code>(allreduce_edu/[^<]+)</code></small>.*?<pre[^>]*>(.*?)</pre>", re.DOTALL)


def shown_listings(notebook: Path) -> list[tuple[int, str, str]]:
    """(cell number, file, code) of every listing show_source made in `notebook`: as text, or
    as HTML (highlighted, perhaps folded into a lesson's own HTML)."""
    found = []
    for number, cell in enumerate(json.loads(notebook.read_text(encoding="utf-8"))["cells"]):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            head, _, code = "".join(data.get("text/plain", "")).partition("\n")
            if head.startswith("# allreduce_edu/"):
                found.append((number, head[2:], code))
            for where, pre in HTML_LISTING.findall("".join(data.get("text/html", ""))):
                code = html.unescape(re.sub(r"<[^>]+>", "", pre)).rstrip("\n")
                found.append((number, where, code))
    return found


def is_whole_block(code: str, text: str) -> bool:
    """`code` stands in `text` as a whole definition: present from the start of a line, and what
    follows it is not more of the same body (a listing whose function later grew would still be
    a prefix)."""
    at = text.find(code + "\n") if not text.endswith(code) else len(text) - len(code)
    while at > 0 and text[at - 1] != "\n":  # inside a longer line: look further on
        at = text.find(code + "\n", at + 1)
    if at < 0:
        return False
    first = code.splitlines()[0]
    indent = len(first) - len(first.lstrip())
    after = [line for line in text[at + len(code):].splitlines() if line.strip()]
    return not after or len(after[0]) - len(after[0].lstrip()) <= indent


def showing_cells(notebook: Path) -> set[int]:
    """The code cells of `notebook` that call show_source themselves (not in a def: a helper
    that calls it shows its listing where it is called)."""
    found = set()
    for n, cell in enumerate(json.loads(notebook.read_text(encoding="utf-8"))["cells"]):
        if cell["cell_type"] != "code" or "show_source(" not in "".join(cell["source"]):
            continue
        tree = ast.parse("".join(cell["source"]))
        in_defs = {id(node) for d in ast.walk(tree) if isinstance(d, ast.FunctionDef)
                   for node in ast.walk(d)}
        if any(isinstance(node, ast.Call) and getattr(node.func, "id", "") == "show_source"
               and id(node) not in in_defs for node in ast.walk(tree)):
            found.add(n)
    return found


@pytest.mark.parametrize("notebook", LESSONS, ids=lambda nb: nb.stem)
def test_every_cell_that_shows_source_has_its_listing_committed(notebook):
    listed = {number for number, _, _ in shown_listings(notebook)}
    assert showing_cells(notebook) <= listed, (
        f"{notebook.name}: cells {sorted(showing_cells(notebook) - listed)} call show_source but "
        f"hold no listing of it (cleared, or printed as a stream): nothing here could check them")


@pytest.mark.parametrize("notebook", LESSONS, ids=lambda nb: nb.stem)
def test_shown_source_is_the_source_now(notebook):
    for number, where, code in shown_listings(notebook):
        assert (ROOT / where).is_file(), f"{notebook.name}, cell {number} lists {where}: gone"
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
    assert not is_whole_block("return x", text)  # not from the start of its line
