"""The command line answers at once (issue 36): heavy imports (nbformat's schema grammar, matplotlib,
the widgets) happen only inside the command that needs them."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.processes  # each test runs the command line in a subprocess
resource = pytest.importorskip("resource", reason="CPU time of a child from getrusage: POSIX only")

HEAVY = ("nbformat", "jsonschema", "matplotlib", "anywidget", "ipywidgets", "allreduce_edu.course.site")


def _cpu_seconds(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, "-m", "allreduce_edu.cli", *args], capture_output=True,
                          text=True, timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done


@pytest.mark.parametrize("args, status", [(("--help",), 0), (("bench", "--algorithm", "foo"), 2)])
def test_help_and_a_bad_argument_answer_in_well_under_a_second_of_cpu(args, status):
    seconds, done = _cpu_seconds(*args)
    assert done.returncode == status, done.stderr
    assert seconds < 1.0, f"allreduce-edu {' '.join(args)} used {seconds:.2f} s of CPU"


def test_parsing_the_command_line_imports_nothing_heavy():
    code = ("import sys; from allreduce_edu.cli import build_parser; "
            "build_parser().parse_args(['bench', '-n', '2']); "
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
