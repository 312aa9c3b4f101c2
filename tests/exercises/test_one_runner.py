"""One runner for a learner's code on ranks (harness.run_on_ranks): every checker calls it, and
what failed carries its rank as an attribute, never read from the error's text (issue 24)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from allreduce_edu.comm.errors import CollectiveTimeout
from allreduce_edu.exercises import harness
from allreduce_edu.runtime import Cluster

EXERCISES = Path(harness.__file__).parent
MODULES = sorted(p for p in EXERCISES.glob("*.py") if p.name != "harness.py")
BROAD = {None, "Exception", "BaseException"}


def _runs_ranks(node: ast.AST) -> bool:
    """Whether `node` starts ranks: cluster.run(...), or run_on_engine(...)."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == "run") or (
        isinstance(f, ast.Name) and f.id == "run_on_engine")


def learner_runs_outside_the_runner(path: Path) -> list[str]:
    """Ranks started inside a try that catches everything: a runner of the learner's code of its
    own (a library measurement needs no such try)."""
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == "run_on_engine" for a in node.names):
            found.append(f"line {node.lineno} imports run_on_engine")
        if not isinstance(node, ast.Try):
            continue
        broad = any((h.type.id if isinstance(h.type, ast.Name) else h.type) in BROAD
                    for h in node.handlers if h.type is None or isinstance(h.type, ast.Name))
        if broad:
            found += [f"line {n.lineno} runs ranks inside a try" for stmt in node.body
                      for n in ast.walk(stmt) if _runs_ranks(n)]
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_no_module_but_the_harness_runs_a_learners_code_on_ranks_itself(path):
    found = learner_runs_outside_the_runner(path)
    assert not found, f"{path.name}: use harness.run_on_ranks — " + "; ".join(found)


def test_the_scan_finds_a_runner_of_its_own(tmp_path):
    own = tmp_path / "lesson99.py"
    own.write_text("def check(fn, cluster):\n    try:\n        return cluster.run(fn)\n"
                   "    except Exception as e:\n        return str(e)\n")
    assert learner_runs_outside_the_runner(own)


def test_the_checkers_that_run_a_learners_code_call_the_runner():
    callers = {p.stem for p in MODULES if "run_on_ranks(" in p.read_text(encoding="utf-8")}
    assert {"lesson00", "lesson01", "lesson04", "lesson07", "lesson08", "lesson09", "lesson11",
            "lesson13"} <= callers, callers
    assert "run_on_ranks(" in Path(harness.__file__).read_text(encoding="utf-8").split(
        "def run_learner(")[1]  # run_learner (lessons 02, 03) runs through it too


def test_the_runner_returns_the_results_or_the_failure_with_its_rank():
    def boom(comm, x):
        if comm.rank == 2:
            raise ValueError("gives up")  # the text names no rank
        return comm.rank + x

    with Cluster(3, "local") as cluster:
        assert harness.run_on_ranks(cluster, lambda comm, x: comm.rank * x, 2) == ([0, 2, 4], None)
        results, failure = harness.run_on_ranks(cluster, boom, 1)
    assert results is None and failure.rank == 2 and failure.on == "rank 2"
    assert type(failure.error) is ValueError and str(failure.error) == "gives up"
    assert "ValueError on rank 2: gives up" in harness.explain_error(failure, (10,))


def test_a_timeout_is_explained_from_its_attributes():
    e = CollectiveTimeout("timed out", ranks=(0,))  # no rank in the text at all
    failure = harness.RankError(e, 1)
    assert "rank 1 waited for a message from rank 0, and it never came" in \
        harness.explain_error(failure, (4,))
    e = CollectiveTimeout("rank 1 waited past its deadline for 'reduce' from rank 0 (plain recv)",
                          ranks=(0,))
    assert "rank 1 waited for 'reduce' from rank 0" in harness.explain_error(
        harness.RankError(e, 1), (4,))
    assert harness.RankError(e, None).on == "a rank"
