"""Lesson 05's checkers: a right answer passes, typical wrong ones fail with a specific hint."""

from __future__ import annotations

import math

import pytest

from allreduce_edu.exercises import reference, registry
from allreduce_edu.exercises.lesson05 import (
    CANDIDATES,
    check_choose,
    check_float_order_answer,
    check_tree_time,
    crossover,
    measured_crossover,
    solution,
)
from allreduce_edu.model.costmodel import predict

ALPHA, BETA = 10e-6, 1 / 20e9


def right(nbytes, world_size, alpha, beta):
    return min(CANDIDATES, key=lambda algorithm: predict(algorithm, world_size, nbytes, alpha, beta))


def always_ring(nbytes, world_size, alpha, beta):
    return "ring"


def fixed_threshold(nbytes, world_size, alpha, beta):
    return "recursive_doubling" if nbytes < 64 << 10 else "rabenseifner"


def misspelled(nbytes, world_size, alpha, beta):
    return "Ring"


def choose(nbytes, world_size, alpha, beta):
    """The scaffold as the lesson ships it."""
    ...  # your code here, in place of `...`


def my_time(algorithm, world_size, nbytes, alpha, beta):
    """The scaffold as the lesson ships it."""
    ...  # your code here, in place of `...`


def formulas(**changed):
    """The reference formulas, with some algorithms' replaced by a typical slip."""
    reference_time = _reference_namespace()["my_time"]

    def my_time(algorithm, world_size, nbytes, alpha, beta):
        if algorithm in changed:
            return changed[algorithm](world_size, nbytes, alpha, beta)
        return reference_time(algorithm, world_size, nbytes, alpha, beta)
    return my_time


def _reference_namespace():
    namespace = {}
    exec(registry.get("05.1").solution, namespace)  # noqa: S102 - our own solution
    return namespace


def test_choose_checker():
    assert check_choose(right)
    assert check_choose(reference("05.1"))  # the solution runs on its own formulas
    assert "at 8 bytes on 2 ranks" in check_choose(always_ring).message
    assert "count the steps" in check_choose(always_ring).message
    feedback = check_choose(fixed_threshold)
    assert not feedback and "you chose" in feedback.message and "fixed threshold" in feedback.message, feedback
    assert "return one of" in check_choose(misspelled).message
    assert "raised ZeroDivisionError" in check_choose(lambda *args: 1 / 0).message


def test_the_formulas_are_checked_against_the_model_for_every_n():
    solved = _reference_namespace()
    feedback = check_choose(solved["choose"], solved["my_time"])
    assert feedback and "your formulas agree with the model's on 2 to 512 ranks" in feedback.message
    assert not check_choose(always_ring, solved["my_time"])  # right formulas, wrong choice


@pytest.mark.parametrize("slip, says", [
    ({"tree": lambda n, s, a, b: 2 * math.log2(n) * (a + s * b)},
     ["tree on N = 3, S = 8 bytes", "your steps (the α term) 3.17, the table's 4", "⌈log2 3⌉ = 2"]),
    ({"ring": lambda n, s, a, b: 2 * (n - 1) * (a + s * b)},
     ["ring on N = 2", "your bytes along the way (the β term) 2·S, the table's 1·S"]),
    ({"recursive_doubling": lambda n, s, a, b: math.log2(n) * (a + s * b)},
     ["recursive_doubling on N = 3", "3 is not a power of two: run on p = 2 ranks", "fold"]),
    ({"rabenseifner": lambda n, s, a, b: 2 * math.log2(n) * a + 2 * (n - 1) / n * s * b},
     ["rabenseifner on N = 3", "not a power of two"]),
    ({"ring": lambda n, s, a, b: 1e6 * (2 * (n - 1) * a + 2 * (n - 1) / n * s * b)},
     ["ring on N = 2", "that is µs: return seconds"]),
    ({"tree": lambda n, s, a, b: None}, ["my_time('tree', 2, 8, 0.0005, 1e-09) returned None"]),
    ({"tree": lambda n, s, a, b: a / b}, ["tree on N = 2", "compare your formula with the table's row"]),
])
def test_a_wrong_formula_names_the_first_algorithm_n_and_s_and_the_term(slip, says):
    feedback = check_choose(right, formulas(**slip))
    assert not feedback and feedback.attempted
    for text in says:
        assert text in feedback.message, feedback


def test_the_formulas_must_be_the_learners_own():
    for borrowed in (predict, lambda a, n, s, al, b: predict(a, n, s, al, b)):
        feedback = check_choose(right, borrowed)
        assert not feedback and "write the four formulas yourself" in feedback.message
    stubbed = check_choose(right, my_time)
    assert not stubbed.attempted and "my_time" in stubbed.message and 'hint("05.1")' in stubbed.message


def test_crossover_is_where_the_lines_meet():
    size = crossover("tree", "ring", 8, ALPHA, BETA)  # lesson 10 imports it from lesson05
    assert size == pytest.approx(8 * ALPHA / (4.25 * BETA))
    assert predict("tree", 8, size, ALPHA, BETA) == pytest.approx(predict("ring", 8, size, ALPHA, BETA))
    assert crossover("ring", "rabenseifner", 2, ALPHA, BETA) is None  # identical lines never cross


def test_tree_time_is_fitted_from_the_ring_then_priced():
    assert check_tree_time(499.3)
    assert check_tree_time(8 * (300e-6 / 30 + (6.59e-3 - 300e-6) / (1.875 * 64)) * 1e6)  # 8 B's β left out
    assert "8 steps" in check_tree_time(499.3).message
    assert predict("tree", 16, 1 << 20, 10e-6, 1 / 20e9) * 1e6 == pytest.approx(499.3, rel=1e-3)


@pytest.mark.parametrize("answer, hint", [
    (499.3e-6, "seconds"), (0.4993, "milliseconds"), (249.7, "two phases"), (998.7, "twice too large"),
    (419.3, "pays its α"), (80.0, "whole MiB"), (398.3, "the ring's time"), (519.3, "take them off"),
    (473.1, "not 2·S"), (700, "factor 1.40"), (-5, "positive"), ("499", "answer with a number")])
def test_tree_time_slips(answer, hint):
    feedback = check_tree_time(answer)
    assert not feedback and hint in feedback.message, feedback


def test_measured_crossover():
    rows = [{"algorithm": a, "bytes": s, "time_us": t} for a, s, t in [
        ("tree", 8, 1), ("ring", 8, 3), ("tree", 1024, 2), ("ring", 1024, 1), ("tree", 4096, 9), ("ring", 4096, 4)]]
    assert measured_crossover(rows) == (8, 1024)
    assert measured_crossover(rows, "ring", "tree") is None


def test_float_order_answer(capsys):
    assert check_float_order_answer("d")
    assert "integer addition (without overflow) is exact" in check_float_order_answer("a").message
    assert "grouping does not matter" in check_float_order_answer("b").message
    assert "two's complement" in check_float_order_answer("c").message
    assert "'a', 'b', 'c' or 'd'" in check_float_order_answer("x").message
    solution("05.2")
    assert "8 · (10 µs + 52.4 µs) ≈ 499 µs" in capsys.readouterr().out


def test_the_scaffolds_are_not_attempts():
    for feedback, exercise in ((check_choose(choose), "05.1"),
                               (check_choose(choose, my_time), "05.1"),
                               (check_tree_time(None), "05.2"),
                               (check_float_order_answer("?"), "05.3")):
        assert not feedback and not feedback.attempted, feedback
        assert f'hint("{exercise}")' in feedback.message


@pytest.mark.parametrize("exercise", ["05.1", "05.2", "05.3"])
def test_the_key_cells_pass(exercise):
    *body, last = registry.get(exercise).key.splitlines()
    namespace = {"predict": predict}  # the lesson imports it near its top
    exec("\n".join([*body, f"result = {last}"]), namespace)  # noqa: S102 - our own key
    assert namespace["result"], namespace["result"]


def test_line_crossover_lies_where_the_fitted_lines_cross_and_shrugs_off_one_noisy_run():
    from allreduce_edu.exercises.lesson05 import line_crossover

    mib = 1 << 20
    sizes = [8, mib // 4, mib // 2, mib, 3 * mib // 2, 2 * mib, 4 * mib, 8 * mib]
    lines = {"tree": (40.0, 40.0), "ring": (70.0, 15.0)}  # ms at 0 B, ms per MiB: cross at 1.2 MiB
    rows = [{"algorithm": a, "bytes": s, "time_us": c + k * s / mib}
            for a, (c, k) in lines.items() for s in sizes]
    assert line_crossover(rows) == pytest.approx(1.2 * mib)
    assert line_crossover(rows, "ring", "tree") is None  # the tree's line never gets below
    noisy = [dict(r, time_us=r["time_us"] * 1.25) if (r["algorithm"], r["bytes"]) == ("ring", 2 * mib)
             else r for r in rows]  # the ring 25 % slow at 2 MiB: slower than the tree there
    assert noisy[sizes.index(2 * mib) + len(sizes)]["time_us"] > rows[sizes.index(2 * mib)]["time_us"]
    assert measured_crossover(noisy) == (2 * mib, 4 * mib)  # the sizes around it jump past 2 MiB
    assert line_crossover(noisy) == pytest.approx(1.2 * mib, rel=0.15)  # the lines hardly move
    faster = [dict(r, time_us=r["time_us"] + 1000) if r["algorithm"] == "tree" else r for r in rows]
    assert line_crossover(faster) is None  # the ring is faster everywhere: no crossing above 0


def test_no_cell_above_the_exercise_shows_the_formulas_in_code():
    """The learner writes the cost model before seeing it: costmodel's listings come after 05.1's
    cell, not before (issue 24)."""
    from allreduce_edu import course

    [path] = [p for p in course.lesson_files() if p.name.startswith("05")]
    cells = course.read(path)["cells"]
    at = next(i for i, c in enumerate(cells) if c.get("metadata", {}).get("exercise") == "05.1")
    shown = "\n".join(course.source(c) + "".join(str(o) for o in c.get("outputs", []))
                      for c in cells[:at])
    for giveaway in ("show_source", "COSTS[", "def ring(", "def _fold(", "def rabenseifner("):
        assert giveaway not in shown, giveaway
    later = "\n".join(course.source(c) for c in cells[at + 1:])
    assert "show_source(costmodel." in later
