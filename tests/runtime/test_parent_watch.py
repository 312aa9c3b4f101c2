"""A rank never outlives its parent, with no helper polling beside it: the kernel's
PR_SET_PDEATHSIG kills it even while its interpreter is stuck holding the GIL."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import HAS_PROC

pytestmark = [pytest.mark.processes,
              pytest.mark.skipif(not sys.platform.startswith("linux") or not HAS_PROC,
                                 reason="reads /proc and sets PR_SET_PDEATHSIG (prctl): Linux only")]

PARENT = textwrap.dedent("""
    import ctypes, os, sys, threading, time, allreduce_edu

    def hold_the_gil(comm):
        # a C call made with the GIL held (PyDLL keeps it): this interpreter can run nothing else
        threading.Timer(0.3, lambda: ctypes.PyDLL(None).sleep(600)).start()
        return os.getpid()

    def start(box):
        box.append(allreduce_edu.Cluster(int(sys.argv[1])))

    if __name__ == "__main__":
        box = []
        if sys.argv[2] == "thread":  # a cluster started by a thread that ends at once
            worker = threading.Thread(target=start, args=(box,))
            worker.start()
            worker.join()
        else:
            start(box)
        cluster = box[0]
        pids = cluster.run(lambda comm: os.getpid())
        print(" ".join(map(str, pids)), flush=True)
        sys.stdin.readline()  # the test looks at the idle cluster meanwhile
        print(" ".join(map(str, cluster.run(hold_the_gil))), flush=True)
        time.sleep(600)
""")


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rpartition(")")[2].split()[1])
            tree.setdefault(parent, []).append(int(entry.name))
    return tree


def _descendants(pid: int) -> set[int]:
    tree, found, todo = _children(), set(), [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"  # a zombie is dead
    except OSError:
        return False


@pytest.mark.parametrize("started_on", ["main", "thread"])
def test_an_idle_cluster_has_no_watchdogs_and_a_stuck_rank_dies_with_its_parent(tmp_path,
                                                                              started_on):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script), "4", started_on], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        ranks = {int(p) for p in parent.stdout.readline().split()}
        assert len(ranks) == 4
        for _ in range(3):  # over a second and a half: nothing forks beside the ranks
            around = _descendants(parent.pid)
            assert ranks <= around and not any(_descendants(r) for r in ranks), around
            assert len(around - ranks) <= 1, f"helpers beside the ranks: {around - ranks}"
            time.sleep(0.5)
        parent.stdin.write("go\n")
        parent.stdin.flush()
        assert {int(p) for p in parent.stdout.readline().split()} == ranks
        time.sleep(1.0)  # the ranks' interpreters are stuck now
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 3.0
        while any(map(_alive, ranks)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [r for r in ranks if _alive(r)], "stuck ranks outlived their parent"
    finally:
        parent.kill()
        for r in ranks if "ranks" in locals() else ():
            if _alive(r):
                os.kill(r, 9)
