"""The course on macOS and Windows, proved on this Linux machine (issue 34): a Python started with
tests/cuts/<system> first on PYTHONPATH lacks the names that system lacks (its ranks and kernels
too: they inherit the environment). There the package imports, all-reduces on gRPC ranks and on
the testbed, and each module that once reached a Linux-only name takes its portable path."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import cut_env

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = ("macos", "windows")

# "module.name" that must be missing under each cut; a bare "module" must not import at all
MISSING = {
    "macos": ["fcntl.F_SEAL_SEAL", "fcntl.F_ADD_SEALS", "os.memfd_create", "os.eventfd",
              "os.pidfd_open", "os.sched_getaffinity", "socket.SO_PEERCRED", "socket.SOCK_CLOEXEC",
              "socket.SOCK_NONBLOCK", "mmap.MAP_POPULATE"],
}
MISSING["windows"] = [n for n in MISSING["macos"] if not n.startswith("fcntl.")] + [
    "fcntl", "resource", "os.killpg", "os.getuid", "os.geteuid", "os.fork", "os.sysconf",
    "signal.SIGKILL", "signal.SIGSTOP", "socket.AF_UNIX", "socket.send_fds", "select.poll"]


def run_cut(system: str, code: str, timeout: float = 180) -> str:
    """Run `code` in a Python cut down to `system`; its output (a failure shows it all)."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          env=cut_env(system),
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"under the {system} cut:\n{done.stdout}\n{done.stderr[-4000:]}"
    return done.stdout


@pytest.mark.parametrize("system", SYSTEMS)
def test_the_cut_really_removes_the_names(system):
    run_cut(system, f"""
        import importlib, socket
        for name in {MISSING[system]!r}:
            module, _, attr = name.partition(".")
            try:
                found = importlib.import_module(module)
            except ImportError:
                assert not attr, f"{{name}}: no module {{module}} at all"
                continue
            assert attr and not hasattr(found, attr), f"{{name}} is still here"
        unix = getattr(socket, "AF_UNIX", 1)  # Windows: refused by its number too
        for kind, address in [(socket.SOCK_SEQPACKET, None), (socket.SOCK_STREAM, b"\\0abstract")]:
            try:
                with socket.socket(unix, kind) as s:
                    if address:
                        s.bind(address)
            except OSError:
                continue
            raise AssertionError(f"the kernel took AF_UNIX, {{kind!r}}, {{address}}")
        a, b = socket.socketpair()  # multiprocessing's Pipe needs one
        a.sendall(b"x")
        assert b.recv(1) == b"x"
    """)


ALLREDUCE = """
    import numpy as np
    import allreduce_edu as ae

    def contribute(comm):
        return ae.allreduce(comm, np.arange(10.0) + comm.rank)

    with {make} as cluster:
        results = cluster.run(contribute)
        {more}
    expected = 4 * np.arange(10.0) + 6  # ranks 0..3 each add their rank
    assert all(np.array_equal(r, expected) for r in results), results
    print("ok")
"""


@pytest.mark.processes
@pytest.mark.parametrize("system", SYSTEMS)
def test_a_4_rank_allreduce_on_grpc_ranks(system):
    # lesson 12's checker counts this machine's cores for the share of them the ranks keep busy
    more = ("from allreduce_edu.exercises.lesson12 import busy_cores\n"
            "        assert busy_cores(cluster, 4096, 2) >= 0")
    assert "ok" in run_cut(system, ALLREDUCE.format(make="ae.Cluster(4)", more=more))


@pytest.mark.processes
@pytest.mark.parametrize("system", SYSTEMS)
def test_a_4_rank_allreduce_on_the_testbed(system):
    """Shared memory on emulated links: the portable backend, on what every system has."""
    assert "ok" in run_cut(system, ALLREDUCE.format(make="ae.testbed(4)", more="pass"))


@pytest.mark.processes
@pytest.mark.parametrize("system", SYSTEMS)
def test_the_modules_made_portable_work_under_the_cut(system, tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys, time
        if os.environ["RANK"] == "0":  # fails at once: the launcher must stop rank 1
            time.sleep(0.5)
            sys.exit(3)
        with open({str(tmp_path / "pid")!r}, "w") as f:
            f.write(str(os.getpid()))
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # deaf to the polite stop: it is killed
        time.sleep(120)
    """))
    out = run_cut(system, f"""
        import multiprocessing, os, time
        from allreduce_edu.cli import main
        from allreduce_edu.runtime import launch, limits, osfacts

        assert osfacts.usable_cpus() >= 1 and limits.limit()[0] >= 1
        free = osfacts.available_bytes()
        print("memory", "unknown" if free is None else "known")

        # launch: a failing rank stops the others, through the portable stop where there is no killpg
        t0 = time.monotonic()
        assert launch.launch([{str(script)!r}], 2, timeout=10) == 3
        assert time.monotonic() - t0 < 30
        pid = int(open({str(tmp_path / "pid")!r}).read())
        try:
            os.kill(pid, 0)
            raise AssertionError(f"rank 1 (pid {{pid}}) outlived its launch")
        except ProcessLookupError:
            pass

        # the elastic lessons' crash: this process's child ends at once, without a handler
        if __name__ == "__main__":
            child = multiprocessing.get_context("spawn").Process(target=osfacts.die_now)
            child.start()
            child.join(60)
            print("die_now", child.exitcode, osfacts.signal_name(child.exitcode))

        assert main(["lessons", "--no-lab", {str(tmp_path / "lessons")!r}]) == 0
    """)
    # on Windows die_now is TerminateProcess (os.kill with SIGTERM); on this kernel, SIGTERM
    expected = {"macos": "die_now -9 SIGKILL", "windows": "die_now -15 SIGTERM"}[system]
    assert expected in out, out
    # the Windows cut hides /proc and sysconf: no memory figure, and the limit counts cores only
    assert ("memory unknown" if system == "windows" else "memory known") in out
    assert sorted(p.name for p in (tmp_path / "lessons").glob("00_*.ipynb")) == ["00_welcome.ipynb"]


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.parametrize("lesson", ["00_welcome", "14_gpu_kernels"])
def test_a_lesson_passes_nbval_under_the_macos_cut(lesson):
    """Its kernel inherits the cut; lesson 14's kernel cells skip there, saying numba-cuda is
    missing (macOS has no build)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs",
                           f"lessons/{lesson}.ipynb"], cwd=ROOT, env=cut_env("macos"),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    if lesson == "14_gpu_kernels":
        assert "needs cuda: numba-cuda" in done.stdout, done.stdout[-3000:]
