"""Every exercise of the course, registered once beside its checker: hints, solution, the
instructor's key.

    @exercise("03.1", kind="code", function="my_ring_allreduce", imports="")
    def check_ring_allreduce(fn, world_sizes=(3, 4), ...) -> Feedback: ...

The title, hints, solution and explanation come from the lesson's data file (lesson03.toml,
table [ "03.1" ]: texts.py); the key, the exercise cell solved, is made from the checker's name, the
solution and the function's (`imports`, `before`/`after`, `args`, `gaps`: where a cell differs).

Choice, number and names exercises are declared as data in spec.py, which registers them here.
The decorated checker answers "not attempted yet" while the answer is still the scaffold's (`None`,
`"?"`, or a function whose body is `...`), records every real attempt in your progress file, and
remembers its last verdict so later cells can run your function or, until it passes, the reference.
"""

from __future__ import annotations

import dis
import functools
import importlib
import inspect
import os
import pkgutil
import types
from dataclasses import dataclass, field

import numpy as np

from .cells import code_key
from .feedback import Feedback, not_attempted, wrap
from .progress import PREDICTIONS, STATUSES, load
from .progress import record as record_progress
from .progress import reset as reset_progress
from .texts import exercise_texts

# write a function, predict a number, pick a letter, fill in names
KINDS = ("code", "number", "choice", "names")


@dataclass
class Exercise:
    """One exercise: what the learner fills in, the hints in order, the solution and the solved
    cell."""

    id: str  # "03.1": lesson 03, exercise 1
    title: str
    kind: str
    hints: tuple[str, ...]
    solution: str  # code exercises: code that defines `function`; the others: the worked answer
    key: str  # the exercise cell with the answer filled in (allreduce-edu lessons --solved)
    explanation: str = ""  # printed after a code solution
    function: str = ""  # code exercises: the function the learner writes
    needs: dict = field(default_factory=dict)  # names the solution's code uses besides np
    todo: str = ""  # what "not attempted yet" asks for
    check: object = None  # the decorated checker
    last: tuple | None = None  # (answer, Feedback) of the last check
    spec: object = None  # choice/number/names: what spec.py generated (cells, question, options)
    # code exercises: the library's own versions of what the learner writes ("module:qualname"
    # under allreduce_edu), which the lesson shows only after the exercise cell
    library: tuple[str, ...] | None = None

    @property
    def lesson(self) -> str:
        return self.id.split(".")[0]


EXERCISES: dict[str, Exercise] = {}
_hints_given: dict[str, int] = {}


def exercise(id: str, title: str | None = None, *, kind: str, hints=None,
             solution: str | None = None, key: str | None = None,
             explanation: str | None = None, function: str = "", needs: dict | None = None,
             answers: tuple[str, ...] | None = None, todo: str = "",
             library: tuple[str, ...] | None = None, **cell):
    """Register the decorated checker as exercise `id`; `answers` names its parameters that hold the
    answer (default: the first one), `library` the library's versions of a code exercise. The
    texts not given come from the lesson's data file; a code exercise's key is made (`code_key`)."""
    if kind not in KINDS:
        raise ValueError(f"exercise {id}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind == "code" and not function:
        raise ValueError(f"exercise {id}: a code exercise names the function the learner writes")

    def register(check):
        nonlocal title, hints, solution, key, explanation
        t = exercise_texts(check.__module__, id)
        title = t["title"] if title is None else title
        hints = t.get("hints", ()) if hints is None else hints
        solution = t["solution"] if solution is None else solution
        explanation = t.get("explanation", "") if explanation is None else explanation
        todo_text = todo or t.get("todo", "")
        if key is None:
            key = code_key(check.__module__, check.__name__, solution, function, **cell)
        signature = inspect.signature(check)
        names = answers or (next(iter(signature.parameters)),)
        ex = Exercise(id, title, kind, tuple(hints), solution.strip("\n"), key.strip("\n"),
                      explanation.strip(), function, dict(needs or {}),
                      todo_text or _default_todo(kind, function, names))
        ex.library = None if library is None else tuple(library)

        def verdict(*args, **kwargs) -> tuple[list, Feedback]:
            bound = signature.bind_partial(*args, **kwargs)
            values = [bound.arguments.get(name) for name in names]
            if any(unanswered(v) for v in values):
                return values, not_attempted(f"{ex.todo} Stuck? hint(\"{id}\") gives a first hint.")
            try:
                return values, check(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - feedback, not a traceback; the learner's own
                # errors are caught inside the checkers (harness.run_on_ranks), so this is the check
                why = f"{type(e).__name__}: {e}"
                message = (f"the check itself could not finish ({why}). If your answer has the "
                           f"type the exercise asks for, run the cell again; this try is not "
                           f"counted.")
                return values, Feedback(False, message, "check failed")

        @functools.wraps(check)
        def checked(*args, **kwargs) -> Feedback:
            values, feedback = verdict(*args, **kwargs)
            if feedback.status in ("passed", "failed"):
                ex.last = (values[0], feedback)
                record_progress(id, "passed" if feedback.passed else "attempted")
            return feedback

        def demo(*args, **kwargs) -> Feedback:
            """The verdict on an answer the lesson shows (a buggy one, say): not your attempt."""
            return verdict(*args, **kwargs)[1]

        checked.exercise, checked.demo = ex, demo
        ex.check = checked
        EXERCISES[id] = ex
        return checked
    return register


def _default_todo(kind: str, function: str, names) -> str:
    if kind == "code":
        return f"write the body of {function} in place of `...`, then run this cell again."
    if kind == "choice":
        return 'replace "?" with the letter of your answer, then run this cell again.'
    if kind == "names":
        return 'fill in every "?" with a name, then run this cell again.'
    return "replace None with your answer (a number), then run this cell again."


def _stub():
    ...


def _instructions(code: types.CodeType) -> list[tuple]:
    return [(i.opname, i.argval) for i in dis.get_instructions(code)
            if i.opname not in ("RESUME", "NOP", "CACHE")]


def is_stub(fn) -> bool:
    """True for a function whose body does nothing (`...`, `pass`, a docstring): the scaffold as
    shipped."""
    code = getattr(fn, "__code__", None)
    return isinstance(code, types.CodeType) and _instructions(code) == _instructions(_stub.__code__)


def unanswered(value) -> bool:
    """Whether `value` is still what a scaffold ships: None, "?", an empty body, or a dict/list of
    those."""
    if value is None:
        return True
    if isinstance(value, str):
        return value.strip() in ("", "?")
    if isinstance(value, dict):
        return not value or all(unanswered(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return not value or all(unanswered(v) for v in value)
    return callable(value) and is_stub(value)


# --- what the learner calls ------------------------------------------------------------------
def get(exercise_id: str) -> Exercise:
    """The exercise `exercise_id` ("03.1"), loading its lesson's checkers if needed."""
    exercise_id = str(exercise_id).strip()
    if exercise_id not in EXERCISES and exercise_id[:2].isdigit():
        try:
            importlib.import_module(f"allreduce_edu.exercises.lesson{exercise_id[:2]}")
        except ImportError:
            pass
    if exercise_id not in EXERCISES:
        raise KeyError(f"no exercise {exercise_id!r}; known: {', '.join(sorted(all_exercises()))}")
    return EXERCISES[exercise_id]


def hint(exercise_id: str) -> None:
    """Print the next hint for an exercise, e.g. hint("03.1"); call again for the one after."""
    ex = get(exercise_id)
    given = _hints_given.get(ex.id, 0)
    if given >= len(ex.hints):
        print(f"No more hints for {ex.id} (you have seen all {len(ex.hints)}). "
              f"solution(\"{ex.id}\") shows an answer.")
        return
    _hints_given[ex.id] = given + 1
    more = (f"hint(\"{ex.id}\") again gives the next one." if given + 1 < len(ex.hints)
            else f"That was the last hint; solution(\"{ex.id}\") shows an answer.")
    print(wrap(f"Hint {given + 1} of {len(ex.hints)} for {ex.id}: {ex.hints[given]}\n({more})"))


def solution(exercise_id: str) -> None:
    """Print the solution of an exercise, e.g. solution("03.1")."""
    ex = get(exercise_id)
    print(ex.solution + (f"\n\n{ex.explanation}" if ex.explanation else ""))


def reference(exercise_id: str):
    """The solution's function of a code exercise, ready to run (on ranks too: it ships by
    value)."""
    ex = get(exercise_id)
    if ex.kind != "code":
        raise ValueError(f"exercise {ex.id} asks for {ex.kind}, not a function")
    # the package as a notebook sees it, looked up when a solution runs (not an import of it)
    package = importlib.import_module(__name__.partition(".")[0])
    namespace = {"__name__": f"solution_{ex.id.replace('.', '_')}", "np": np,
                 "allreduce_edu": package, **ex.needs}
    exec(compile(ex.solution, f"<solution {ex.id}>", "exec"),  # noqa: S102 - our own solution text
         namespace)
    return namespace[ex.function]


def learner_or_reference(exercise_id: str, fn):
    """`fn` if it passed its exercise's checker, else the reference solution; says which one
    runs."""
    ex = get(exercise_id)
    if ex.last is not None and ex.last[0] is fn:
        feedback = ex.last[1]
    else:  # checked again here (a new kernel, say): the verdict counts, the try was counted before
        feedback = ex.check.demo(fn)
    name = getattr(fn, "__name__", ex.function)
    if feedback.passed:
        print(f"Running your {name}: it passed exercise {ex.id}.")
        return fn
    why = "is not written yet" if not feedback.attempted else "has not passed its checker yet"
    print(wrap(f"Your {name} {why} (exercise {ex.id}), so the reference solution runs in its "
               f"place. Solve {ex.id} and run this cell again to see yours."))
    return reference(ex.id)


def all_exercises() -> dict[str, Exercise]:
    """Every exercise of the course, by id (importing every lesson's checkers)."""
    here = os.path.dirname(__file__)  # this package's folder, found without importing it
    for module in pkgutil.iter_modules([here]):
        if module.name.startswith("lesson"):
            importlib.import_module(f"{__package__}.{module.name}")
    return dict(sorted(EXERCISES.items()))


class Progress:
    """A table of the course's exercises (passed, attempted or not started) with your recorded
    predictions beside them (from your progress file)."""

    def __init__(self, exercises: dict[str, Exercise], records: dict[str, dict]):
        self.rows = [(ex, records.get(ex.id, {})) for ex in exercises.values()]
        guesses = records.get(PREDICTIONS)
        self.predictions = dict(sorted(guesses.items())) if isinstance(guesses, dict) else {}

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(STATUSES, 0)
        for _, record in self.rows:
            counts[record.get("status", "not started")] += 1
        return counts

    def __repr__(self) -> str:
        from .predictions import show

        marks = {"passed": "✓ passed", "attempted": "✗ attempted", "not started": "· not started"}
        width = max(len(ex.title) for ex, _ in self.rows)
        lines = []
        for ex, record in self.rows:
            status = record.get("status", "not started")
            tries = record.get("attempts", 0)
            lines.append((ex.id, f"{ex.id:<9} {ex.title:<{width}}  {marks[status]}"
                          + (f" ({tries} tr{'y' if tries == 1 else 'ies'})" if tries else "")))
        for key, p in self.predictions.items():
            unit = p.get("unit", "")
            said = {"measured": p.get("said", "measured"), "model": "the model said"}
            seen = "".join(f", {said[what]} {show(p[what], unit)}" for what in ("measured", "model")
                           if what in p)
            lines.append((key, f"{key:<9} {'your prediction':<{width}}  "
                               f"{show(p.get('value'), unit)}{seen}"))
        c = self.counts()
        n = len(self.predictions)
        guessed = f", {n} prediction{'' if n == 1 else 's'} recorded" if n else ""
        total = (f"{c['passed']} of {len(self.rows)} passed, {c['attempted']} attempted, "
                 f"{c['not started']} not started{guessed}.")
        return "\n".join([f"{'exercise':<9} {'what':<{width}}  status"]
                         + [line for _, line in sorted(lines, key=lambda kv: kv[0])] + [total])


def progress(reset: bool = False) -> Progress:
    """Your progress through the course's exercises and predictions; `progress(reset=True)`
    forgets it and starts over."""
    if reset:
        reset_progress()
        _hints_given.clear()
    return Progress(all_exercises(), load())
