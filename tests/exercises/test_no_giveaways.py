"""The learner builds it before seeing it: no cell above a code exercise shows its solution or the
library's version of it, and no number exercise's answer is printed in its lesson (issue 24)."""

from __future__ import annotations

import ast
import copy
import html
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

import allreduce_edu
from allreduce_edu import course
from allreduce_edu.exercises import registry, spec

EXERCISES = registry.all_exercises()
LESSONS = {p.name[:2]: course.read(p) for p in course.lesson_files()}
CODE = sorted(i for i, ex in EXERCISES.items() if ex.kind == "code")
PACKAGE = Path(allreduce_edu.__file__).parent

# --- what a cell shows ------------------------------------------------------------------------
def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else (value or "")


def outputs(cell: dict) -> str:
    """What a code cell's stored outputs show (HTML as text: a folded listing is still a
    listing)."""
    parts = []
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        parts += [_text(out.get("text")), _text(data.get("text/plain"))]
        if "text/html" in data:
            parts.append(html.unescape(re.sub(r"<[^>]+>", "", _text(data["text/html"]))))
    return "\n".join(parts)


def code_lines(source: str) -> list[str]:
    """The lines of code that give an algorithm away: no comments, docstrings, signatures,
    imports or short lines; whitespace collapsed."""
    lines = []
    for line in source.splitlines():
        code = "" if line.strip().startswith("#") else re.split(r"\s#\s?", line)[0].strip()
        if len(code) >= 16 and not code.startswith(("def ", "@", '"""', "from ", "import ")):
            lines.append(re.sub(r"\s+", " ", code))
    return lines


def library_source(dotted: str) -> tuple[str, str]:
    """(name, source) of "module:qualname" under allreduce_edu, read from its file (no import: the
    torch and CUDA modules need what this machine may lack)."""
    module, qualname = dotted.split(":")
    path = PACKAGE.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    text = path.read_text(encoding="utf-8")
    nodes = ast.parse(text).body
    for name in qualname.split("."):
        node = next(n for n in nodes if getattr(n, "name", None) == name)
        nodes = getattr(node, "body", [])
    lines = text.splitlines()[node.lineno - 1:node.end_lineno]
    return qualname.split(".")[-1], "\n".join(lines)


# --- (a) code exercises: neither the solution nor the library's version above the question -----
def test_every_code_exercise_declares_the_library_functions_it_rebuilds():
    undeclared = [i for i in CODE if EXERCISES[i].library is None]
    assert not undeclared, f"declare library=(...) in @exercise (() if none): {undeclared}"
    for i in CODE:
        for dotted in EXERCISES[i].library:
            name, source = library_source(dotted)  # raises when the function moved
            assert f"def {name}(" in source, (i, dotted)


def shown_above(exercise: str, nb: dict) -> list[str]:
    """What cells above the exercise's give away: a show_source call on a library version, its
    listing (its `def` line in markdown or an output), half or more of its lines or of the
    registered solution's."""
    ex = EXERCISES[exercise]
    cells = nb["cells"]
    above = cells[:cells.index(course.exercise_cells(nb)[exercise])]
    versions = [("the registered solution", code_lines(ex.solution), None)]
    for dotted in ex.library or ():
        name, source = library_source(dotted)
        versions.append((dotted, code_lines(source), name))
    problems = []
    for k, cell in enumerate(above):
        # what the learner reads: markdown, or a code cell's outputs; and everything, code too
        read = outputs(cell) if cell["cell_type"] == "code" else course.source(cell)
        text = re.sub(r"[ \t]+", " ", course.source(cell) + "\n" + outputs(cell))
        for what, lines, name in versions:
            if name and re.search(rf"show_source\(\s*[\w.]*\b{name}\b", course.source(cell)):
                problems.append(f"cell {k} calls show_source on {what}")
            elif name and f"def {name}(" in read:
                problems.append(f"cell {k} shows the listing of {what}")
            elif lines and 2 * sum(line in text for line in lines) >= len(lines):
                problems.append(f"cell {k} holds {what}: "
                                f"{[line for line in lines if line in text][:3]}")
    return problems


@pytest.mark.parametrize("exercise", CODE)
def test_no_cell_above_a_code_exercise_shows_its_solution_or_the_librarys_version(exercise):
    problems = shown_above(exercise, LESSONS[exercise[:2]])
    assert not problems, f"{exercise} is answered above its question: " + "; ".join(problems)


def _with_cell_above(exercise: str, cell: dict) -> dict:
    nb = copy.deepcopy(LESSONS[exercise[:2]])
    nb["cells"].insert(nb["cells"].index(course.exercise_cells(nb)[exercise]), cell)
    return nb


def _code_cell(source: str, printed: str = "") -> dict:
    return {"cell_type": "code", "metadata": {}, "source": source,
            "outputs": [{"output_type": "stream", "name": "stdout", "text": printed}]}


def test_the_check_catches_a_listing_above_the_exercise():
    ring = library_source("collectives.ring:reduce_scatter_ring")[1]
    assert shown_above("03.1", _with_cell_above("03.1", _code_cell("show_source(allreduce_ring)")))
    assert shown_above("03.1", _with_cell_above("03.1", _code_cell("folded(f)", ring)))
    pasted = {"cell_type": "markdown", "metadata": {}, "source": EXERCISES["02.1"].solution}
    assert shown_above("02.1", _with_cell_above("02.1", pasted))
    assert not shown_above("03.1", _with_cell_above("03.1", _code_cell("allreduce_ring(comm, x)")))


# --- (b) number exercises: the answer is not printed anywhere in the lesson ----------------------
SCALES = {"seconds": ((1e3, "ms"), (1e6, "µs"), (1e6, "us")),
          "bytes": ((2**10, "KiB"), (2**20, "MiB"), (2**30, "GiB"), (1e3, "kB"), (1e6, "MB"),
                    (1e9, "GB"))}


UNIT_WORDS = {"bytes": ["bytes", "B"], "seconds": ["seconds", "s"]}


def _digits(form: str) -> int:
    return len(re.sub(r"\D", "", form).lstrip("0"))


def printed_forms(value: float, unit: str, plain_only: bool = False) -> dict[str, bool]:
    """{how a lesson could print `value`: whether it must be followed by a unit to count} — %g,
    2 to 4 significant digits, fixed decimals, thousands separators, a percentage of a fraction
    and, for seconds and bytes, the scaled units (ms, MiB, ...)."""
    forms = {}
    for f in (f"{value:g}", f"{value:.2g}", f"{value:.3g}", f"{value:.4g}", f"{value:.1f}",
              f"{value:.2f}") + ((str(int(value)), f"{int(value):,}") if value == int(value) else ()):
        if "e" not in f and _digits(f) >= 2:
            forms.setdefault(f, _digits(f) < 3)  # a short number counts only with its unit
    if plain_only:
        return {f: short for f, short in forms.items() if not short}
    scaled = [(value * k if unit == "seconds" else value / k, u) for k, u in SCALES.get(unit, ())]
    if 0 < value < 1:
        scaled += [(100 * value, "%"), (100 * value, " %")]
    for v, u in scaled:
        for f in (f"{v:g}", f"{v:.2g}", f"{v:.3g}", f"{v:.1f}", f"{v:,.0f}"):
            if "e" not in f and _digits(f) >= 2 and v >= 1:
                forms[f + (u if u.startswith(("%", " ")) else f" {u}")] = False
    return forms


def answer_values(answer):
    """The numbers to look for: each blank's, a list as a whole (as NumPy or Python prints it)."""
    if isinstance(answer, dict):
        for value in answer.values():
            yield from answer_values(value)
    elif isinstance(answer, (list, tuple)):
        yield [str([float(v) for v in answer]), str([int(v) for v in answer]),
               "[" + " ".join(f"{float(v):g}." for v in answer) + "]"]
    else:
        yield float(answer)


def fixed(spec_data) -> bool:
    return not any(v is spec.REQUIRED for v in spec_data.inputs.values())


NUMBERS = sorted(i for i, ex in EXERCISES.items() if ex.kind == "number" and fixed(ex.spec))


def lesson_prose_and_outputs(nb: dict):
    for k, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "markdown":
            yield k, "markdown", course.source(cell)
        else:
            yield k, "output", outputs(cell)


def printed_answers(exercise: str, nb: dict) -> list[str]:
    """Where exercise's answer, formatted as a lesson would print it (printed_forms), appears in
    the markdown or the stored outputs of `nb`.

    To avoid false positives: whole answers below 10 (03.0's rank 1, 04.2's 8 and 5 steps) are
    not looked for, a form of fewer than 3 significant digits counts only when its unit follows
    (73 ms, 14 messages, 12×), and an answer equal to one of the exercise's own inputs (10.2: the
    copied bytes are S, which the question states) is looked for only as a plain byte count.
    Exercises whose inputs are measured in the lesson (01.1, 06.2, 10.1: `REQUIRED`) have no fixed
    answer to look for and are not covered here."""
    data = EXERCISES[exercise].spec
    answer = data.answer(SimpleNamespace(**data.inputs))
    inputs = {float(v) for v in data.inputs.values() if isinstance(v, (int, float))}
    unit_words = UNIT_WORDS.get(data.unit, [re.escape(data.unit)])
    after_unit = rf"\s?(?:{'|'.join(w for w in unit_words + ['×', 'x'] if w)})(?!\w)"
    found = []
    for value in answer_values(answer):
        if isinstance(value, list):
            patterns = {re.escape(form): form for form in value}
        elif value == int(value) and abs(value) < 10:
            continue
        else:
            forms = printed_forms(value, data.unit, plain_only=value in inputs)
            patterns = {rf"(?<![\d.,]){re.escape(f)}(?![\d]|[.,]\d)"
                        + (after_unit if short else ""): f for f, short in forms.items()}
        for k, where, text in lesson_prose_and_outputs(nb):
            for pattern, form in patterns.items():
                for m in re.finditer(pattern, text):
                    found.append(f"cell {k} ({where}) prints {form!r}: "
                                 f"…{text[max(0, m.start() - 60):m.end() + 20]}…")
    return found


@pytest.mark.parametrize("exercise", NUMBERS)
def test_no_number_exercise_answer_is_printed_in_its_lesson(exercise):
    found = printed_answers(exercise, LESSONS[exercise[:2]])
    assert not found, f"{exercise}'s answer is printed in its lesson: " + "\n".join(found)


def test_the_check_catches_a_printed_answer():
    def printing(exercise, text):
        return printed_answers(exercise, _with_cell_above(exercise, _code_cell("print(x)", text)))

    assert printing("10.2", "a rank copies 16777216 bytes")  # the answer is S: its byte count
    assert not printing("10.2", "16 MiB ring")  # S itself, as the question states it
    assert printing("12.2", "exposed: 73.0 ms") and printing("12.2", "0.073 s")
    assert printing("08.2", "112 messages") and printing("08.2", "on 16 ranks: 240 messages")
    assert not printing("08.2", "cap 1024 B: 14 all-reduces/step")  # 14 of something else
    assert printing("00.1", "[60. 64. 68. 72.]")


def test_the_number_exercises_looked_for_include_every_fixed_answer():
    assert len(NUMBERS) >= 12, NUMBERS  # the exercises with fixed inputs, of the course's ~17
