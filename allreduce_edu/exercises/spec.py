"""Choice, number and names exercises as data: one spec generates the checker, the scaffold cell,
the instructor's key, the question's markdown and the "not attempted yet" text.

    choice("03.4", module=__name__)   # lesson03.toml's [ "03.4" ]: checker, title, question,
                                      # options, right, slips, why, hints

The texts come from the lesson's data file (texts.py), by id; the Python passes what it computes
(answers, slip values, the values a message shows). The checker is defined in the lesson module
under the name the data file gives it (`checker = "check_busbw_answer"`), and returned.

A number passes within TOLERANCE of the answer (counts of bytes, steps or ranks exactly); a slip
(a typical wrong value) gets its own hint, matched with the same tolerance. A spec whose slips lie
closer to its answer than that (a goodput near its optimum) states a narrower `tolerance`.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import numpy as np

from .cells import Blank, Cell, NamesCell, markdown, quoted
from .feedback import Feedback, failed, passed
from .registry import exercise
from .texts import exercise_texts, fill

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


def _register(id, title, kind, cell: Cell, check, signature, hints, solution, todo, answers,
              markdown, **data):
    check.__signature__ = signature
    check.__name__ = check.__qualname__ = cell.checker
    check.__module__ = cell.module
    checked = exercise(id, title, kind=kind, hints=hints, solution=solution, key=cell.key,
                       todo=todo, answers=answers)(check)
    checked.exercise.spec = SimpleNamespace(cell=cell, markdown=markdown, **data)
    if cell.module in sys.modules:  # the lesson module: its checker, named by the data file
        setattr(sys.modules[cell.module], cell.checker, checked)
    return checked


_DATA = object()  # an argument not given: the data file's text


def _text(t: dict, id: str, key: str, given=_DATA, default=_DATA):
    """`given` if the Python passed it, else the data file's text (or `default` when absent)."""
    if given is not _DATA:
        return given
    if key in t:
        return t[key]
    if default is _DATA:
        raise KeyError(f"exercise {id}: its lesson's data file has no {key!r}")
    return default


# --- choice ----------------------------------------------------------------------------------
def choice(id: str, *, module: str, right=_DATA, values: dict | None = None,
           imports: str = "hint, solution"):
    """A multiple-choice exercise: every wrong option is a misconception with its own hint
    (`question` None, or none in the data file: the lesson asks it in its own words); `values`
    fill the {placeholders} of the data file's slips and why."""
    t = exercise_texts(module, id)
    title, checker, question = t["title"], t["checker"], t.get("question")
    options, slips, why, hints = t["options"], t["slips"], t["why"], tuple(t["hints"])
    right = _text(t, id, "right", right)
    if values is not None:
        slips = {x: fill(text, values) for x, text in slips.items()}
        why = fill(why, values)
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
                     f"again.", None, markdown(id, "explain", question, options),
                     options=dict(options), right=right)


# --- number ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Slip:
    """A typical wrong value and the hint it earns; `blank` names the answer it is for."""

    value: float
    hint: str  # a key of the data file's [ "NN.M".slips ] (or the hint itself)
    blank: str = ""
    values: dict = field(default_factory=dict)  # this slip's {placeholders} besides the spec's


def number(id: str, *, module: str, blanks: tuple[Blank, ...], answer, inputs: dict | None = None,
           slips=None, values=None, success=_DATA, otherwise=_DATA, unit: str = "",
           exact: bool = False, setup: str = "", call: str = "",
           verb: str = "predict", tolerance: float = TOLERANCE,
           imports: str = "hint, solution"):
    """A number exercise: `answer(d)` gives the value (or {blank: value}) from the inputs `d`;
    `slips(d)` the typical wrong values with their hints; `values(d)` what the messages'
    {placeholders} show besides the inputs (`success(d)`, `otherwise(d, name, got)`: a message
    computed in Python)."""
    t = exercise_texts(module, id)
    title, checker, question = t["title"], t["checker"], t.get("question")
    hints, solution, todo = tuple(t["hints"]), t["solution"], t.get("todo", "")
    success, otherwise = _text(t, id, "success", success), _text(t, id, "otherwise", otherwise, "")
    filled = t.get("slips", {})
    comments = t.get("blanks", {})
    blanks = tuple(b if b.comment else replace(b, comment=comments[b.variable]) for b in blanks)
    inputs = dict(inputs or {})

    def shown(d, text: str, **more) -> str:  # a data file's message, its {placeholders} filled in
        return fill(text, {**vars(d), **(values(d) if values else {}), **more})
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
                    hint = (shown(d, filled[slip.hint], **slip.values) if slip.hint in filled
                            else slip.hint)
                    return failed(_label(name, names) + hint)
            if exact and not whole:
                return failed(f"{_label(name, names)}a count is a whole number, not "
                              f"{_show(got)}: round where the algorithm does.")
            rest = (otherwise(d, name, got) if callable(otherwise) else
                    shown(d, otherwise.get(name, "") if isinstance(otherwise, dict) else otherwise,
                          name=name, got=got) if "otherwise" in t else otherwise)
            return failed(f"{_label(name, names)}{_show(got)} is not it"
                          + (f": {rest}" if rest else "."))
        return passed(success(d) if callable(success) else
                      shown(d, success) if "success" in t else success)

    return _register(id, title, "number", cell, check, signature, hints, solution,
                     todo or _todo(blanks, unit), tuple(names), markdown(id, verb, question),
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
def names(id: str, *, module: str, table: dict[str, tuple[str, ...]], success=_DATA,
          normalise=str.strip, fallback=None, key_value=None, verb: str = "translate"):
    """A names exercise: fill in a dict {ours: theirs}; `table` holds the accepted names (the first
    is the solution's), `slips` a hint for a typical wrong (key, name) (the data file's
    [ "NN.M".slips.KEY ] NAME = "hint"), `fallback(key, name)` for any other."""
    t = exercise_texts(module, id)
    title, checker, question = t["title"], t["checker"], t["question"]
    hints, success = tuple(t["hints"]), _text(t, id, "success", success)
    slips = {(ours, got): hint for ours, named in t.get("slips", {}).items()
             for got, hint in named.items()}
    value = key_value or (lambda theirs: theirs[0])
    accepted = {k: {normalise(n).upper() for n in v} for k, v in table.items()}

    def cell(solved: bool) -> str:
        lesson = module.rsplit(".", 1)[-1]
        return (f"from allreduce_edu.exercises.{lesson} import {checker}, hint, solution\n\n"
                "my_names = {\n" + "".join(f"    {quoted(k)}: "
                                            f"{quoted(value(v) if solved else '?')},\n"
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
                     markdown(id, verb, question))

