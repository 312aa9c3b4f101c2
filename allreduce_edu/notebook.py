"""Helpers for the lessons: show the library's own source, highlighted
(lessons show code, never paste it)."""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass

FOLD_LINES = 20  # listings longer than this show folded (STYLE: internals linked or folded)


@dataclass(frozen=True)
class Source:
    """Source code that shows highlighted in a notebook and as plain text elsewhere."""

    code: str
    where: str

    def __repr__(self) -> str:
        return f"# {self.where}\n{self.code}"

    def _repr_html_(self) -> str:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer

        body = highlight(self.code, PythonLexer(),
                         HtmlFormatter(noclasses=True, style="default", nobackground=True))
        where = f"<small><code>{self.where}</code></small>"
        lines = self.code.count("\n") + 1
        if lines > FOLD_LINES:  # a long listing is folded: the lesson's text stays in view
            return (f'<details style="font-size:90%"><summary>{where} ({lines} lines: click to '
                    f"show)</summary>{body}</details>")
        return f'<div style="font-size:90%">{where}{body}</div>'


def show_source(obj) -> Source:
    """The source of a library function, class or module, with the file it lives in."""
    obj = inspect.unwrap(obj)
    path = inspect.getsourcefile(obj) or "?"
    package_path = path[path.rfind("allreduce_edu"):] if "allreduce_edu" in path else path
    return Source(inspect.getsource(obj).rstrip("\n"), package_path)


#: set (to anything) and a claim that does not hold raises instead of printing its ✗: how
#: tests/system/test_busy_laptop.py requires every claim of every lesson's key to hold
STRICT_CLAIMS = "ALLREDUCE_EDU_STRICT_CLAIMS"


class ClaimNotShown(AssertionError):
    """A lesson's claim that its measurement did not support (raised only in strict mode)."""


def claim(holds, text: str) -> None:
    """A sentence about a measurement, checked against it: prints "✓ text" when `holds`, else
    says the numbers above do not support it. What nbval compares is the sentence, not its mark
    (lessons/nbval_sanitize.cfg reads a ✗ as a ✓): a busy laptop may move a measurement, and a
    lesson's check must not turn on that. With ALLREDUCE_EDU_STRICT_CLAIMS set, a claim that does
    not hold raises ClaimNotShown (the cell fails), so a test can require every claim to hold."""
    if not holds and os.environ.get(STRICT_CLAIMS):
        raise ClaimNotShown(f"this claim did not hold: {text}")
    print(f"✓ {text}" if holds else
          f"✗ not shown this time: {text}. The measurement above does not support it; a busy "
          f"machine slows some runs more than others: run the measuring cell again.")
