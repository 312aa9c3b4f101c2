"""Every exercise's prose comes from its lesson's data file (exercises/lessonNN.toml): one table per
registered exercise, every table used, and no prose written into the checkers' calls."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from allreduce_edu.exercises import registry, texts

EXERCISES = registry.all_exercises()
HERE = Path(texts.__file__).parent
LESSONS = sorted(HERE.glob("lesson[0-9][0-9].py"))
PROSE = {"title", "question", "options", "right", "slips", "why", "hints", "solution", "explanation",
         "todo", "success", "otherwise", "checker", "key"}


def test_no_module_exists_only_to_hold_questions():
    assert not sorted(HERE.glob("lesson*_questions.py"))


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_every_table_of_a_lesson_is_a_registered_exercise_and_every_exercise_has_one(path):
    data = texts.lesson(path.stem)
    registered = {i for i, ex in EXERCISES.items() if ex.check.__module__.endswith(path.stem)}
    assert registered, f"{path.stem} registers no exercise"
    assert set(data) == registered, (f"tables without an exercise: {sorted(set(data) - registered)}; "
                                     f"exercises without a table: {sorted(registered - set(data))}")


@pytest.mark.parametrize("exercise", sorted(EXERCISES))
def test_the_registered_texts_are_the_data_files(exercise):
    ex = EXERCISES[exercise]
    table = texts.exercise_texts(ex.check.__module__, exercise)
    assert ex.title == table["title"]
    assert ex.hints == tuple(table["hints"])
    if ex.kind == "code":
        assert ex.solution == table["solution"].strip("\n")
        assert ex.explanation == table.get("explanation", "").strip()
    if ex.spec is not None:
        assert ex.spec.cell.checker == table["checker"] == ex.check.__name__


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_the_python_passes_no_prose_to_an_exercise(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") in (
                "choice", "number", "names", "exercise"):
            assert len(node.args) == 1, f"line {node.lineno}: the title belongs in {path.stem}.toml"
            for kw in node.keywords:
                literal = isinstance(kw.value, (ast.Constant, ast.JoinedStr, ast.Tuple, ast.Dict))
                assert not (kw.arg in PROSE and literal), \
                    f"line {node.lineno}: {kw.arg}= belongs in {path.stem}.toml"
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("Slip", "Blank"):
            for arg in node.args[1:2]:
                long_text = isinstance(arg, ast.JoinedStr) or (
                    isinstance(arg, ast.Constant) and isinstance(arg.value, str) and " " in arg.value)
                assert not long_text, f"line {node.lineno}: its text belongs in {path.stem}.toml"


def test_a_message_fills_its_placeholders():
    assert texts.fill("{n} ranks, {s:.1f} s", {"n": 4, "s": 0.25}) == "4 ranks, 0.2 s"


def _literals(tree: ast.AST):
    """The string literals of a module that are not docstrings (an f-string counts its text)."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                  and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    for node in ast.walk(tree):
        if id(node) in docstrings or id(node) in parts:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node, node.value
        elif isinstance(node, ast.JoinedStr):
            yield node, "".join(v.value for v in node.values if isinstance(v, ast.Constant))


@pytest.mark.parametrize("path", sorted(HERE.glob("lesson[0-9][0-9]*.py")), ids=lambda p: p.stem)
def test_the_checkers_prose_is_in_the_data_file(path):
    long = [(node.lineno, text[:60]) for node, text in _literals(ast.parse(path.read_text()))
            if len(text) > 120]
    assert not long, f"{path.name}: move these texts to its lesson's .toml (texts.message): {long}"


@pytest.mark.parametrize("path", sorted(HERE.glob("lesson[0-9][0-9]*.py")), ids=lambda p: p.stem)
def test_every_message_names_a_text_and_fills_exactly_its_placeholders(path):
    """message(module, "NN.M", "name", **values) and Slip(value, "name", values={...}): the text
    exists in the data file and the Python passes the values its {placeholders} show."""
    import string

    data = texts.lesson(path.stem[:8])
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        if getattr(node.func, "id", "") == "message":
            id, name = node.args[1].value, node.args[2].value
            text, given = data[id]["messages"][name], {kw.arg for kw in node.keywords}
        elif getattr(node.func, "id", "") == "Slip" and any(kw.arg == "values" for kw in node.keywords):
            name = node.args[1].value
            [text] = [t["slips"][name] for t in data.values() if name in t.get("slips", {})]
            values = next(kw.value for kw in node.keywords if kw.arg == "values")
            given = {k.value for k in values.keys}
            wanted = {f for _, f, _, _ in string.Formatter().parse(text) if f}
            assert given <= wanted, f"line {node.lineno}: {name} does not show {given - wanted}"
            continue  # the spec's inputs and values fill in the rest
        else:
            continue
        wanted = {field for _, field, _, _ in string.Formatter().parse(text) if field}
        assert wanted <= given, f"line {node.lineno}: {name} shows {wanted - given}, not passed"
        assert given <= wanted, f"line {node.lineno}: {name} does not show {given - wanted}"
