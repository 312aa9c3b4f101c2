"""Symmetric windows (comm.window) and the algorithms on them (collectives/symmetric.py): the API on
threads and on both shared-memory backends, every N from 1 to 9, refusals, a rank killed while the
others wait on its signal, and nothing left behind."""

from __future__ import annotations

import glob
import os
import re
import time

import numpy as np
import pytest
from conftest import DTYPES, KILLED, check_allreduce, cluster_for, shm_objects

import allreduce_edu as ae
from allreduce_edu.comm.errors import CollectiveMismatch, CollectiveTimeout
from allreduce_edu.comm.transports.shm import portable as shm_portable
from allreduce_edu.comm.window import WindowsUnavailable, rendezvous
from allreduce_edu.runtime.osfacts import die_now

WINDOWED = ["one_shot", "two_shot"]


def _ring_of_puts(comm):
    """Each rank puts its rank into the next rank's window and signals it, twice (the second
    round reuses the slot: the counts, not a 0/1 flag, tell the rounds apart)."""
    window = rendezvous(comm, 64)
    n, r, seen = comm.world_size, comm.rank, []
    for round_ in range(2):
        window.put((r + 1) % n, np.array([10 * round_ + r], np.int64))
        window.put_signal((r + 1) % n)
        window.wait_signal((r - 1) % n)
        seen.append(int(window.get_buffer(r, 1, np.int64)[0]))
        window.barrier()  # nobody overwrites a slot its owner has not read yet
    return seen, int(window.pads[r][0, (r - 1) % n])


def _expect_ring(results, n):
    for r, (seen, count) in enumerate(results):
        assert seen == [(r - 1) % n, 10 + (r - 1) % n] and count == 4, (r, seen, count)  # 2 + 2 barriers


@pytest.mark.parametrize("n", [2, 3, 5])
def test_put_signal_wait_and_barrier_on_threads(n):
    _expect_ring(cluster_for("local", n).run(_ring_of_puts), n)


@pytest.mark.processes
def test_put_signal_wait_and_barrier_on_each_shm_backend(shm_backend):
    _expect_ring(cluster_for("shm", 4, backend=shm_backend).run(_ring_of_puts), 4)


def _bad_calls(comm):
    window = rendezvous(comm, 32)
    errors = []
    for call in (lambda: window.get_buffer(comm.rank, 5, np.float64),     # 40 bytes > 32
                 lambda: window.get_buffer(comm.rank, 1, np.float64, 4),  # misaligned
                 lambda: window.put_signal(comm.world_size),               # not a rank
                 lambda: rendezvous(comm, -1)):
        try:
            call()
        except ValueError as e:
            errors.append(str(e))
    try:
        window.wait_signal((comm.rank + 1) % comm.world_size, channel=1, timeout=0.2)  # nobody signals
    except CollectiveTimeout as e:
        errors.append(str(e))
    window.barrier()
    return errors


def test_bad_arguments_and_a_signal_that_never_comes_are_named():
    for rank, errors in enumerate(cluster_for("local", 2).run(_bad_calls)):
        assert len(errors) == 5, errors
        assert "does not fit a 32-byte window" in errors[0] and "aligned to 8" in errors[1]
        assert "not a rank of this world" in errors[2] and "nbytes=-1" in errors[3]
        peer = 1 - rank
        assert re.search(rf"rank {rank} waited past its deadline for signal 1 on channel 1 from "
                         rf"rank {peer} \(slot \[1, {peer}\] of its signal pad held 0\)", errors[4]), errors[4]


@pytest.mark.processes
def test_grpc_has_no_windows_and_says_what_has():
    with pytest.raises(WindowsUnavailable, match=r"grpc transport cannot map.*transport='shm'"):
        cluster_for("grpc", 2).run(lambda comm: rendezvous(comm, 8))


@pytest.mark.parametrize("algorithm", WINDOWED)
@pytest.mark.parametrize("n", range(1, 10))
def test_one_and_two_shot_on_threads_for_every_n(algorithm, n):
    for op, dtype, size in [("sum", "float32", 0), ("max", "int64", 1), ("prod", "float64", n + 1),
                            ("min", "int32", 1009), ("sum", "float64", 7)]:
        check_allreduce(cluster_for("local", n), algorithm, op, (size,), dtype, seed=size)


@pytest.mark.processes
@pytest.mark.parametrize("algorithm", WINDOWED)
@pytest.mark.parametrize("n", [2, 5, 9])
def test_one_and_two_shot_on_shm_ranks(algorithm, n):
    cluster = cluster_for("shm", n)
    for op, dtype in zip(["sum", "max", "prod", "min"], DTYPES, strict=True):
        check_allreduce(cluster, algorithm, op, (2 * n + 1,), dtype, seed=n)
    check_allreduce(cluster, algorithm, "sum", (0,), "float32")
    check_allreduce(cluster, algorithm, "sum", (3, 5), "float64", strided=True)
    check_allreduce(cluster, algorithm, "sum", (300_001,), "float32")  # the window grows


@pytest.mark.processes
@pytest.mark.parametrize("algorithm", WINDOWED)
def test_one_and_two_shot_on_the_portable_backend(algorithm):
    cluster = cluster_for("shm", 4, backend="portable")
    for op, dtype in zip(["sum", "max", "prod", "min"], DTYPES, strict=True):
        check_allreduce(cluster, algorithm, op, (13,), dtype, seed=4)


@pytest.mark.parametrize("algorithm", WINDOWED)
def test_ranks_that_call_differently_get_a_mismatch_not_a_wrong_sum(algorithm):
    cluster = cluster_for("local", 3)
    with pytest.raises(CollectiveMismatch, match="called a different all-reduce on the window"):
        cluster.run(lambda comm: ae.allreduce(comm, np.ones(4 + (comm.rank == 2), np.float32),
                                              algorithm=algorithm))


def test_reads_are_trace_events_that_replay_to_a_full_reduction():
    from allreduce_edu.viz.replay import replay
    cluster = cluster_for("local", 4)
    for algorithm, tags in [("one_shot", {"one_shot"}), ("two_shot", {"reduce_scatter", "all_gather"})]:
        cluster.run(lambda comm, a: ae.allreduce(comm, np.arange(8.0), algorithm=a), algorithm)
        events = list(cluster.trace)
        assert {e.tag for e in events} == tags and all(e.via == "window" for e in events)
        final = replay(cluster.trace, 4)[-1]
        assert all(chunk == frozenset(range(4)) for held in final.held for chunk in held), algorithm


def _wait_on_a_dying_rank(comm, victim):
    window = rendezvous(comm, 64)
    if comm.rank == victim:
        die_now()
    window.wait_signal(victim)


@pytest.mark.processes
def test_a_rank_killed_while_the_others_wait_on_its_signal_fails_them_and_leaks_nothing(shm_backend):
    before = shm_objects()
    with ae.Cluster(4, transport="shm", timeout=20) as cluster:
        t0 = time.monotonic()
        with pytest.raises(ae.RankFailure) as info:
            cluster.run(_wait_on_a_dying_rank, 2)
        assert time.monotonic() - t0 < 10, "the survivors sat out their deadline"
        assert re.search(rf"rank 2 died \({KILLED}\)", str(info.value)), info.value
        cluster.restart()
        results = cluster.run(lambda comm: ae.allreduce(comm, np.ones(5), algorithm="one_shot"))
        assert all((y == 4).all() for y in results)
    assert shm_objects() == before


def _names_while_open(comm):
    window = rendezvous(comm, 1 << 16)
    window.barrier()  # every rank is past rendezvous: each has removed its window's name
    names = glob.glob(os.path.join(glob.escape(shm_portable.scratch_base()), shm_portable.PREFIX + "*"))
    window.barrier()
    return names


@pytest.mark.processes
def test_an_open_window_has_no_name_another_cluster_could_map():
    """A portable window's name is removed once every rank has mapped every window: a process of
    another cluster (or anyone) finds nothing to open; the linux backend's memfds never had one."""
    before = set(glob.glob(os.path.join(shm_portable.scratch_base(), shm_portable.PREFIX + "*")))
    for names in cluster_for("shm", 3, backend="portable").run(_names_while_open):
        assert set(names) <= before, set(names) - before


@pytest.mark.parametrize("algorithm", WINDOWED)
@pytest.mark.parametrize("transport", ["local", pytest.param("shm", marks=pytest.mark.processes)])
def test_a_run_that_failed_part_way_leaves_the_next_runs_right(algorithm, transport):
    """A failed call leaves the signal counts out of step; the next run opens a fresh window, so its
    sums are right on every rank (they were silently wrong before: review finding)."""
    cluster = cluster_for(transport, 3)
    with pytest.raises(CollectiveMismatch):
        cluster.run(lambda comm, a: ae.allreduce(comm, np.ones(4 if comm.rank == 0 else 8),
                                                 algorithm=a), algorithm)
    for e in range(2, 6):
        ys = cluster.run(lambda comm, a, e: ae.allreduce(comm, np.full(4, float(e)), algorithm=a),
                         algorithm, e)
        assert all((y == 3 * e).all() for y in ys), (e, ys)


def _channels(comm):
    window = rendezvous(comm, 8)
    errors = []
    for channel in (-1, 4, 1.5):
        try:
            window.put_signal((comm.rank + 1) % comm.world_size, channel)
        except ValueError as e:
            errors.append(str(e))
    window.barrier()
    return errors


def test_a_channel_outside_the_pad_is_refused():
    for errors in cluster_for("local", 2).run(_channels):
        assert len(errors) == 3 and all("valid channels are 0..3" in e for e in errors), errors


def _sizes_that_map_alike(comm):
    """Rank 1 asks for 60 bytes, the others for 64: segments of whole cache lines map alike."""
    try:
        rendezvous(comm, 60 if comm.rank == 1 else 64)
    except CollectiveMismatch as e:
        return str(e)
    return "opened"


@pytest.mark.parametrize("transport", ["local", pytest.param("shm", marks=pytest.mark.processes)])
def test_sizes_that_round_to_the_same_memory_are_still_a_mismatch_on_every_rank(transport):
    said = cluster_for(transport, 3).run(_sizes_that_map_alike)
    assert said[1].startswith("rank 0 asked for a window of 64 bytes, rank 1 for 60"), said
    for r in (0, 2):
        assert said[r].startswith(f"rank 1 asked for a window of 60 bytes, rank {r} for 64"), said
    assert cluster_for(transport, 3).run(_opens_alike) == [60] * 3


def _opens_alike(comm):
    window = rendezvous(comm, 60)
    try:
        return window.nbytes
    finally:
        window.close()
