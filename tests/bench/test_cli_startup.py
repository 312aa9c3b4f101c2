"""The command line answers at once (issue 36): heavy imports (nbformat's schema grammar, matplotlib,
the widgets) happen only inside the command that needs them."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.processes  # each test runs the command line in a subprocess
resource = pytest.importorskip("resource", reason="CPU time of a child from getrusage: POSIX only")

HEAVY = ("nbformat", "jsonschema", "matplotlib", "anywidget", "ipywidgets", "allreduce_edu.course.site")


def _cpu_seconds(*argv: str) -> tuple[float, subprocess.CompletedProcess]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done


@pytest.mark.parametrize("args, status", [(("--help",), 0), (("bench", "--algorithm", "foo"), 2)])
def test_help_and_a_bad_argument_cost_little_more_cpu_than_importing_the_package(args, status):
    # the peer, timed in the same run: a Python that imports the package and does nothing else
    # (0.4 s of CPU on one machine of this kind, 0.9 s on a slower one); nbformat's schema
    # grammar alone added 3.1 s
    _cpu_seconds("-c", "import allreduce_edu")  # the bytecode is compiled: neither pays for it
    peer = min(_cpu_seconds("-c", "import allreduce_edu")[0] for _ in range(2))
    seconds, done = _cpu_seconds("-m", "allreduce_edu.cli", *args)
    assert done.returncode == status, done.stderr
    assert seconds < peer + 0.5, (f"allreduce-edu {' '.join(args)} used {seconds:.2f} s of CPU, "
                                  f"importing the package {peer:.2f} s")


def test_parsing_the_command_line_imports_nothing_heavy():
    code = ("import sys; from allreduce_edu.cli import build_parser; "
            "build_parser().parse_args(['bench', '-n', '2']); "
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
