"""Choice, number and names exercises as data: one spec generates the checker, the scaffold cell,
the instructor's key, the question's markdown and the "not attempted yet" text.

    check_busbw_answer = choice("03.4", "...", module=__name__, checker="check_busbw_answer",
                                question="...", options={"a": "...", ...}, right="d",
                                slips={"a": "hint", ...}, why="...", hints=(...))

A number passes within TOLERANCE of the answer (counts of bytes, steps or ranks exactly); a slip
(a typical wrong value) gets its own hint, matched with the same tolerance. A spec whose slips lie
closer to its answer than that (a goodput near its optimum) states a narrower `tolerance`.
"""

from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from .feedback import Feedback, failed, passed
from .registry import exercise

TOLERANCE = 0.02  # the one policy: a measured or rounded answer within 2 % passes
MIB = 1 << 20
REQUIRED = inspect.Parameter.empty  # an input the cell passes (alpha, beta: measured above)


def close(value, target, exact: bool = False, tolerance: float = TOLERANCE) -> bool:
    """Whether `value` is the answer `target` (numbers or arrays of them): equal for counts,
    within `tolerance` (relative) otherwise."""
    value, target = np.asarray(value, dtype=float), np.asarray(target, dtype=float)
    if value.shape != target.shape:
        return False
    if exact:
        return bool(np.array_equal(value, target))
    return bool(np.allclose(value, target, rtol=tolerance, atol=1e-12))


@dataclass(frozen=True)
class Blank:
    """One value the learner fills in: the cell's variable, its comment, the key's expression."""

    variable: str
    comment: str
    key: str  # the solved cell's expression (allreduce-edu lessons --solved)
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


def _markdown(id: str, verb: str, question: str | None, options: dict | None = None):
    """The question's markdown cell text, as the lesson shows it (None: the lesson asks in its own
    words, as a prediction inside the narrative)."""
    if question is None:
        return None
    text = textwrap.fill(f"**{id} — {verb}.** {' '.join(question.split())}", 110)
    text += "".join(f"\n- ({x}) {options[x]}" for x in sorted(options or {}))
    return (f"{text}\n\nStuck? `hint(\"{id}\")` gives a hint (call "
            f"it again for the next one); `solution(\"{id}\")` shows an answer.")


def _register(id, title, kind, cell: Cell, check, signature, hints, solution, todo, answers,
              markdown, **data):
    check.__signature__ = signature
    check.__name__ = check.__qualname__ = cell.checker
    check.__module__ = cell.module
    checked = exercise(id, title, kind=kind, hints=hints, solution=solution, key=cell.key,
                       todo=todo, answers=answers)(check)
    checked.exercise.spec = SimpleNamespace(cell=cell, markdown=markdown, **data)
    return checked


# --- choice ----------------------------------------------------------------------------------
def choice(id: str, title: str, *, module: str, checker: str, question: str | None,
           options: dict[str, str], right: str, slips: dict[str, str], why: str,
           hints: tuple[str, ...], imports: str = "hint, solution"):
    """A multiple-choice exercise: every wrong option is a misconception with its own hint
    (`question` None: the lesson asks it in its own words)."""
    if set(slips) | {right} != set(options) or right in slips:
        raise ValueError(f"exercise {id}: every wrong option needs its own hint, the right none")
    letters = sorted(options)
    listed = ", ".join(f'"{x}"' for x in letters[:-1]) + f' or "{letters[-1]}"'
    cell = Cell(module, checker, (Blank("my_choice", listed, f'"{right}"', empty='"?"'),),
                imports=imports)

    def check(choice) -> Feedback:
        picked = str(choice).strip().lower().strip("()")
        if picked not in options:
            quoted = [repr(x) for x in letters]
            return failed(f"answer with {', '.join(quoted[:-1])} or {quoted[-1]}.")
        return passed(why) if picked == right else failed(f"not {picked}: {slips[picked]}")

    signature = inspect.Signature([inspect.Parameter("choice",
                                                     inspect.Parameter.POSITIONAL_OR_KEYWORD)])
    return _register(id, title, "choice", cell, check, signature, hints,
                     f"{right}: {options[right]}\n\n{why}",
                     f'replace "?" with the letter of your answer ({listed}), then run this cell '
                     f"again.", None, _markdown(id, "explain", question, options),
                     options=dict(options), right=right)


# --- number ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Slip:
    """A typical wrong value and the hint it earns; `blank` names the answer it is for."""

    value: float
    hint: str
    blank: str = ""


def number(id: str, title: str, *, module: str, checker: str, question: str | None,
           blanks: tuple[Blank, ...], answer, inputs: dict | None = None, slips=None,
           success, otherwise: str | object = "", unit: str = "", exact: bool = False,
           hints: tuple[str, ...], solution: str, setup: str = "", call: str = "",
           verb: str = "predict", todo: str = "", tolerance: float = TOLERANCE,
           imports: str = "hint, solution"):
    """A number exercise: `answer(d)` gives the value (or {blank: value}) from the inputs `d`;
    `slips(d)` the typical wrong values with their hints; `success(d)` the passing message."""
    inputs = dict(inputs or {})
    names = [b.keyword or b.variable.removeprefix("my_") for b in blanks]
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    signature = inspect.Signature([inspect.Parameter(n, kind) for n in names]
                                  + [inspect.Parameter(k, kind, default=v)
                                     for k, v in inputs.items()])
    cell = Cell(module, checker, tuple(blanks), setup, call, imports)

    def check(*args, **kwargs) -> Feedback:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        d = SimpleNamespace(**bound.arguments)
        want = answer(d)
        want = want if isinstance(want, dict) else {names[0]: want}
        for name in names:
            got, shape = getattr(d, name), np.shape(want[name])
            try:  # a number, or a list of them; a string is not one, however it reads
                got = None if isinstance(got, (str, bytes)) else np.asarray(got, dtype=float)
            except (TypeError, ValueError):
                got = None
            what = f"a list of {shape[0]} numbers" if shape else "a number"
            if got is not None and got.shape != shape and shape:
                return failed(f"{_label(name, names)}your answer has shape {got.shape}, but this "
                              f"one is {what} (shape {shape}): write {what}.")
            if got is None or got.shape != shape:
                return failed(f"{_label(name, names)}answer with {what}"
                              f"{f' of {unit}' if unit else ''} (or an expression that gives "
                              f"{'them' if shape else 'one'}).")
            if not np.all(np.isfinite(got)):
                return failed(f"{_label(name, names)}{got} is not a number you can check.")
            if np.any(got < 0):
                return failed(f"{_label(name, names)}the answer is a positive number"
                              f"{f' of {unit}' if unit else ''}, not {got.tolist()}.")
            whole = bool(np.all(got == np.floor(got)))
            got = got.tolist() if shape else float(got)
            if close(got, want[name], exact, tolerance):
                continue
            for slip in (slips(d) if slips else ()):
                if slip.blank in ("", name) and close(got, slip.value, exact, tolerance):
                    return failed(_label(name, names) + slip.hint)
            if exact and not whole:
                return failed(f"{_label(name, names)}a count is a whole number, not "
                              f"{_show(got)}: round where the algorithm does.")
            rest = otherwise(d, name, got) if callable(otherwise) else otherwise
            return failed(f"{_label(name, names)}{_show(got)} is not it"
                          + (f": {rest}" if rest else "."))
        return passed(success(d) if callable(success) else success)

    return _register(id, title, "number", cell, check, signature, hints, solution,
                     todo or _todo(blanks, unit), tuple(names), _markdown(id, verb, question),
                     answer=answer, inputs=inputs, unit=unit, exact=exact)


def _show(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _label(name: str, names) -> str:
    return f"{name.replace('_', ' ')}: " if len(names) > 1 else ""


def _todo(blanks, unit: str) -> str:
    what = " and ".join(b.variable for b in blanks)
    return (f"replace None in {what} with your answer{'s' if len(blanks) > 1 else ''}"
            f"{f' ({unit})' if unit else ''}, then run this cell again.")


# --- names -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class NamesCell:
    """A names exercise's cells: a dict literal, one line per key."""

    module: str
    checker: str
    scaffold: str
    key: str


def names(id: str, title: str, *, module: str, checker: str, question: str,
          table: dict[str, tuple[str, ...]], success: str, hints: tuple[str, ...],
          slips: dict[tuple[str, str], str] | None = None, normalise=str.strip,
          fallback=None, key_value=None, verb: str = "translate"):
    """A names exercise: fill in a dict {ours: theirs}; `table` holds the accepted names (the first
    is the solution's), `slips` a hint for a typical wrong (key, name), `fallback(key, name)` for
    any other."""
    slips, value = dict(slips or {}), key_value or (lambda theirs: theirs[0])
    accepted = {k: {normalise(n).upper() for n in v} for k, v in table.items()}

    def cell(solved: bool) -> str:
        lesson = module.rsplit(".", 1)[-1]
        return (f"from allreduce_edu.exercises.{lesson} import {checker}, hint, solution\n\n"
                "my_names = {\n" + "".join(f"    {_quoted(k)}: "
                                            f"{_quoted(value(v) if solved else '?')},\n"
                                            for k, v in table.items())
                + f"}}\n{checker}(my_names)")

    def check(answer) -> Feedback:
        if not isinstance(answer, dict):
            return failed("answer with a dict {ours: theirs}, as the cell ships it.")
        todo = []
        for ours in table:
            if ours not in answer:
                return failed(f"your dict has no entry for {ours!r}; keep every key.")
            got = normalise(str(answer[ours]))
            if got in ("", "?"):
                todo.append(ours)
            elif got.upper() not in accepted[ours]:
                why = slips.get((ours, got)) or (fallback(ours, got) if fallback else
                                                 "look for it in the table above.")
                return failed(f"{ours}: {answer[ours]!r} is not it. {why}")
        if todo:
            return failed(f"the names you filled in are right, but {len(todo)} of the "
                          f"{len(table)} are still \"?\", the first {todo[0]!r}: fill in every "
                          f"one.")
        return passed(success)

    solution = "{\n" + "".join(f"    {k!r}: {v[0]!r},\n" for k, v in table.items()) + "}"
    signature = inspect.Signature([inspect.Parameter("answer",
                                                     inspect.Parameter.POSITIONAL_OR_KEYWORD)])
    return _register(id, title, "names", NamesCell(module, checker, cell(False), cell(True)),
                     check, signature, hints, solution,
                     'fill in every "?" with a name, then run this cell again.', None,
                     _markdown(id, verb, question))


def _quoted(text: str) -> str:
    return f"'{text}'" if '"' in text else f'"{text}"'
