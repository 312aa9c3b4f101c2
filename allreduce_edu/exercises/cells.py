"""What an exercise generates besides its checker: the exercise cell as shipped (the scaffold) and
solved (the instructor's key), and the question's markdown, as the lesson shows them."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class Blank:
    """One value the learner fills in: the cell's variable, its comment, the key's expression."""

    variable: str
    comment: str = ""  # "": the data file's [ "NN.M".blanks ] entry for the variable
    key: str = ""  # the solved cell's expression (allreduce-edu lessons --solved)
    keyword: str = ""  # the checker's parameter when the cell passes it by name
    empty: str = "None"  # what the scaffold holds


@dataclass
class Cell:
    """The exercise cell a spec generates: the scaffold as shipped, and the key (solved)."""

    module: str
    checker: str
    blanks: tuple[Blank, ...]
    setup: str = ""  # lines both cells start with (question data: S, N = 16 << 20, 4)
    call: str = ""  # what the checker call passes after the blanks (alpha, beta)
    imports: str = "hint, solution"  # what the cell imports besides the checker

    def _lines(self, solved: bool) -> str:
        lesson = self.module.rsplit(".", 1)[-1]
        names = ", ".join(n for n in (self.checker, self.imports) if n)
        head = f"from allreduce_edu.exercises.{lesson} import {names}\n\n"
        setup = self.setup.strip("\n") + "\n" if self.setup else ""
        width = max(len(f"{b.variable} = {b.empty}") for b in self.blanks)
        body = "".join(f"{f'{b.variable} = ' + (b.key if solved else b.empty):<{width}}"
                       f"   # {b.comment}\n" for b in self.blanks)
        args = [f"{b.keyword}={b.variable}" if b.keyword else b.variable for b in self.blanks]
        call = f"{self.checker}({', '.join(args + ([self.call] if self.call else []))})"
        return head + setup + body + call

    @property
    def scaffold(self) -> str:
        return self._lines(solved=False)

    @property
    def key(self) -> str:
        return self._lines(solved=True)


def markdown(id: str, verb: str, question: str | None, options: dict | None = None):
    """The question's markdown cell text, as the lesson shows it (None: the lesson asks in its own
    words, as a prediction inside the narrative)."""
    if question is None:
        return None
    text = textwrap.fill(f"**{id} — {verb}.** {' '.join(question.split())}", 110)
    text += "".join(f"\n- ({x}) {options[x]}" for x in sorted(options or {}))
    return (f"{text}\n\nStuck? `hint(\"{id}\")` gives a hint (call "
            f"it again for the next one); `solution(\"{id}\")` shows an answer.")


@dataclass(frozen=True)
class NamesCell:
    """A names exercise's cells: a dict literal, one line per key."""

    module: str
    checker: str
    scaffold: str
    key: str


def code_key(module: str, checker: str, solution: str, function: str, *,
             imports: str = "hint, solution", before=(), after=(), args=(), gaps=(1, 1)) -> str:
    """A code exercise's cell with the solution in it: the checker's import (`before` and `after`:
    the cell's other import lines), the solution, `gaps` blank lines around it, the checker call."""
    lesson = module.rsplit(".", 1)[-1]
    names = ", ".join(n for n in (checker, imports) if n)
    head = "\n".join([*before, f"from allreduce_edu.exercises.{lesson} import {names}", *after])
    return (head + "\n" * (gaps[0] + 1) + solution.strip("\n") + "\n" * (gaps[1] + 1)
            + f"{checker}({', '.join([function, *args])})")


def quoted(text: str) -> str:
    return f"'{text}'" if '"' in text else f'"{text}"'
