"""Shared memory never outlives its ranks, and a dead rank never hangs the others.

Every case counts the shared memory this user holds (mappings and /dev/shm entries; without /proc,
the portable backend's named files) before and after, on each backend (`shm_backend`); ranks are SIGKILLed at the first, middle and last send of
every algorithm.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from conftest import HAS_PROC, KILLED, interrupt_me, shm_objects

import allreduce_edu as ae
from allreduce_edu.collectives import ALGORITHMS, DESCRIPTIONS
from allreduce_edu.runtime.osfacts import die_now

pytestmark = pytest.mark.processes

COUNT = 1 << 18  # 1 MiB of float32: every algorithm's messages go through segments


def _sends_of(algorithm: str, victim: int, world_size: int = 4) -> int:
    with ae.Cluster(world_size, transport="local") as cluster:
        cluster.run(lambda comm: ae.allreduce(comm, np.ones(COUNT, np.float32), algorithm=algorithm))
        return sum(e.src == victim for e in cluster.trace)


def _killed_at(comm, victim, algorithm, k):
    if comm.rank == victim:
        isend, count = comm.isend, itertools.count()

        def dying_isend(*args, **kwargs):
            if next(count) == k:
                die_now()
            return isend(*args, **kwargs)
        comm.isend = dying_isend
    return ae.allreduce(comm, np.ones(COUNT, np.float32), algorithm=algorithm)


def _kill_cases(victim=1):
    for algorithm in sorted(a for a in ALGORITHMS if DESCRIPTIONS[a].needs != "windows"):  # sends
        sends = _sends_of(algorithm, victim)
        for k in sorted({0, sends // 2, sends - 1}):
            yield algorithm, k


def _check_kills(cases, victim=1):
    before = shm_objects()
    with ae.Cluster(4, transport="shm", timeout=20) as cluster:
        for algorithm, k in cases:
            t0 = time.monotonic()
            with pytest.raises(ae.RankFailure) as info:
                cluster.run(_killed_at, victim, algorithm, k)
            assert time.monotonic() - t0 < 10, f"{algorithm}, send {k}: survivors sat out their deadline"
            assert re.search(rf"rank {victim} died \({KILLED}\)", str(info.value)), (algorithm, k, info.value)
            cluster.restart()
            results = cluster.run(lambda comm, a: ae.allreduce(comm, np.ones(COUNT, np.float32),
                                                               algorithm=a), algorithm)
            assert all((y == 4).all() for y in results), (algorithm, k)
    assert shm_objects() == before


def test_a_rank_killed_mid_ring_and_mid_tree_fails_the_others_at_once_and_leaks_nothing(shm_backend):
    _check_kills([("ring", 2), ("tree", 0)])


def test_a_rank_killed_mid_double_binary_tree_and_mid_bruck_fails_the_others_at_once(shm_backend):
    _check_kills([(a, _sends_of(a, 1) // 2) for a in ("double_binary_tree", "bruck")])


@pytest.mark.slow
def test_a_rank_killed_at_the_first_middle_and_last_send_of_every_algorithm(shm_backend):
    _check_kills(list(_kill_cases()))


def test_a_normal_close_leaves_no_shared_memory(shm_backend):
    before = shm_objects()
    with ae.Cluster(4, transport="shm") as cluster:
        cluster.run(lambda comm: ae.allreduce(comm, np.ones(1 << 21, np.float32)))
        # the segments exist while the ranks do (without /proc, only named ones can be seen: the
        # receivers have unlinked theirs)
        assert shm_objects() > before or not HAS_PROC
    assert shm_objects() == before


def test_a_killed_parent_takes_its_ranks_and_their_shared_memory_with_it(tmp_path, shm_backend):
    before = shm_objects()
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent("""
        import os, time, numpy as np, allreduce_edu as ae
        if __name__ == "__main__":
            cluster = ae.Cluster(3, transport="shm")
            cluster.run(lambda comm: ae.allreduce(comm, np.ones(1 << 21, np.float32)))
            print(" ".join(str(p) for p in cluster.run(lambda comm: os.getpid())), flush=True)
            time.sleep(60)
    """))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 3 and (shm_objects() > before or not HAS_PROC)
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 15
        while shm_objects() != before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert shm_objects() == before
    finally:
        parent.kill()


def _long_loop(comm):
    x = np.ones(1 << 18, np.float32)
    for _ in range(100_000):
        x = ae.allreduce(comm, x) / comm.world_size
    return x


def test_ctrl_c_stops_shm_ranks_keeps_the_cluster_and_leaks_nothing(shm_backend):
    before = shm_objects()
    with ae.Cluster(3, transport="shm", timeout=30) as cluster:
        threading.Timer(0.5, interrupt_me).start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            cluster.run(_long_loop)
        assert time.monotonic() - t0 < 10
        results = cluster.run(lambda comm: ae.allreduce(comm, np.arange(6.0) + comm.rank))
        assert all(np.array_equal(r, np.arange(6.0) * 3 + 3) for r in results)
    assert shm_objects() == before
