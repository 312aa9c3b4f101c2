"""Emulated links (α + bytes·β per message) and the hierarchical all-reduce that exploits a two-level network."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import cluster_for

import allreduce_edu as ae
from allreduce_edu.collectives.hierarchical import hierarchical, node_size
from allreduce_edu.model.costmodel import predict_on_links
from allreduce_edu.model.links import Link, Links, parse_topology, sleep_until

MiB = 1 << 20
# a slow network between nodes: 2 ms per message and 1 MiB in 20 ms; fast links inside a node
SLOW = Links.two_level(2, intra=(20e-6, 1e-9 / 10), inter=(2e-3, 20e-3 / MiB))


def test_links_read_like_a_datasheet_and_pickle():
    assert (Link.parse("50us,1GB/s").alpha, Link.parse("50us,1GB/s").beta) == pytest.approx((50e-6, 1e-9))
    assert (Link.parse("2ms, 400Mbit/s").alpha, Link.parse("2ms, 400Mbit/s").beta) == pytest.approx((2e-3, 8 / 400e6))
    assert Link.parse("1s,1kB/s").seconds(1000) == pytest.approx(2.0)
    links = Links.two_level(4, intra="5us,10GB/s", inter=(1e-3, 1e-8))
    assert pickle.loads(pickle.dumps(links)) == links  # it travels to the rank processes
    assert [links.node(r) for r in (0, 3, 4, 7)] == [0, 0, 1, 1]
    assert links.link(1, 2) == links.intra and links.link(3, 4) == links.inter and links.link(5, 5) is None
    assert parse_topology("2x4") == (2, 4)
    for bad in ("fast", "50us", "1ms,0GB/s"):
        with pytest.raises(ValueError):
            Link.parse(bad)
    with pytest.raises(ValueError):
        parse_topology("2by2")


def test_sleep_until_is_accurate_where_sleep_overshoots():
    for seconds in (100e-6, 1e-3, 5e-3):
        times = []
        for _ in range(15):
            t0 = time.perf_counter()
            sleep_until(time.monotonic() + seconds)
            times.append(time.perf_counter() - t0)
        assert min(times) >= seconds  # never early; late only when the host's scheduler is busy elsewhere
        assert min(times) == pytest.approx(seconds, rel=0.2, abs=50e-6)


def _send_times(comm, sizes, dsts, reps=5):
    """Rank 0 times comm.send to each dst; the others receive. Returns {(dst, size): least seconds}
    (the least of `reps`: a busy host's scheduler only ever adds time, never takes it away)."""
    out = {}
    for dst in dsts:
        for size in sizes:
            x = np.zeros(size, np.uint8)
            times = []
            for _ in range(reps):
                if comm.rank == 0:
                    t0 = time.perf_counter()
                    comm.send(dst, x, "probe")
                    times.append(time.perf_counter() - t0)
                elif comm.rank == dst:
                    comm.recv(0, "probe")
            out[(dst, size)] = min(times) if times else 0.0
    return out


def test_each_message_waits_alpha_plus_bytes_beta_never_less_and_once():
    """Each send takes its link's α + nβ: never less (the emulation sleeps until then), and less than
    1.5 times it (a link charged twice would take twice). Late only as the host's scheduler makes it:
    the least of 7 tries was 20 % over once in ~30 runs beside other work (0.2 ms on the 1 ms link)."""
    # links far slower than the in-process transport (a 1 MiB copy costs up to ~0.5 ms on a busy host)
    links = Links.two_level(2, intra=(1e-3, 10e-3 / MiB), inter=(3e-3, 30e-3 / MiB))
    sizes = (0, 64 << 10, MiB)
    with ae.Cluster(4, transport="local", links=links) as cluster:
        measured = cluster.run(_send_times, sizes, (1, 2), 7)[0]
    for (dst, size), seconds in measured.items():
        wanted = links.link(0, dst).seconds(size)
        assert wanted <= seconds < 1.5 * wanted, (dst, size, seconds, wanted)


def _one_way(comm, size, reps=5):
    """Ping-pong between rank 0 and rank 2 (across nodes): the least round trip / 2."""
    x, times = np.zeros(size, np.uint8), []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        if comm.rank == 0:
            comm.send(2, x, "ping")
            comm.recv(2, "pong")
        elif comm.rank == 2:
            comm.send(0, comm.recv(0, "ping"), "pong")
        times.append(time.perf_counter() - t0)
    return min(times[1:]) / 2


@pytest.mark.processes
def test_over_grpc_a_cross_node_message_waits_its_link_time_once():
    """The emulated link delays the message by at least its time (22 ms), and only once: gRPC adds
    about 1 ms on a quiet machine, several on a busy one, never a second link time."""
    with ae.Cluster(4, links=SLOW) as cluster:
        one_way = cluster.run(_one_way, MiB)[0]
    link = SLOW.inter.seconds(MiB)
    assert link <= one_way < 1.9 * link, f"one way {one_way * 1e3:.1f} ms, the link {link * 1e3:.1f} ms"


# --- the hierarchical all-reduce: correct for every world, node size, op and dtype ------------------
def _contribution(rank: int, length: int, dtype) -> np.ndarray:
    return ((np.arange(length) * (rank + 3)) % 17 - 8 + rank).astype(dtype)


def _expected(n: int, length: int, op: str, dtype) -> np.ndarray:
    stack = np.stack([_contribution(r, length, np.float64) for r in range(n)])
    return (stack.sum(axis=0) if op == "sum" else stack.max(axis=0)).astype(dtype)


def _run_all(comm, lengths, ops, dtypes):
    return {(length, op, dtype): ae.allreduce(comm, _contribution(comm.rank, length, dtype), op, "hierarchical")
            for length in lengths for op in ops for dtype in dtypes}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 8])
def test_hierarchical_matches_numpy_on_every_node_size(n):
    lengths, ops, dtypes = (0, 1, n - 1, n + 1, 1009), ("sum", "max"), ("float32", "int64")
    for per_node in sorted({1, 2, 3, 4, n}):  # uneven node sizes fall back to one node
        with ae.Cluster(n, transport="local", links=Links.two_level(per_node)) as cluster:
            per_rank = cluster.run(_run_all, lengths, ops, dtypes)
        for key, expected in ((k, _expected(n, *k)) for k in per_rank[0]):
            for rank, results in enumerate(per_rank):
                assert results[key].dtype == expected.dtype and results[key].shape == expected.shape
                np.testing.assert_array_equal(results[key], expected, err_msg=f"n={n} L={per_node} {key} rank {rank}")


@pytest.mark.processes
def test_hierarchical_on_grpc_ranks_with_two_per_node():
    def run(comm):
        comm.ranks_per_node = 2  # as allreduce_edu.init() sets it from the launch's ranks per node
        try:
            return node_size(comm), _run_all(comm, (0, 7, 1009), ("sum", "max"), ("float32", "int64"))
        finally:
            comm.ranks_per_node = None
    per_rank = cluster_for("grpc", 4).run(run)
    assert {size for size, _ in per_rank} == {2}
    for _, results in per_rank:
        for key, y in results.items():
            np.testing.assert_array_equal(y, _expected(4, *key))


def test_hierarchical_takes_any_registered_algorithm_between_nodes():
    x = [np.arange(10.0) * (r + 1) for r in range(6)]
    with ae.Cluster(6, transport="local") as cluster:
        for inter in ("ring", "tree", "recursive_doubling"):
            results = cluster.run(lambda comm, inter=inter: hierarchical(comm, x[comm.rank], "sum", 2, inter))
            assert all(np.array_equal(y, np.arange(10.0) * 21) for y in results)
            assert {e.tag.split("/")[0] for e in cluster.trace.events} == {"intra", "inter"}


def test_the_model_says_hierarchical_wins_when_the_network_is_slow():
    assert predict_on_links("hierarchical", 4, MiB, SLOW) < predict_on_links("ring", 4, MiB, SLOW) / 2
    assert predict_on_links("ring", 4, MiB, SLOW) == pytest.approx(6 * SLOW.inter.seconds(MiB / 4))
    one_node = Links.two_level(4, SLOW.intra, SLOW.inter)  # everything inside one node: both are the ring
    assert predict_on_links("hierarchical", 4, MiB, one_node) == predict_on_links("ring", 4, MiB, one_node)
    assert predict_on_links("tree", 4, MiB, SLOW) == pytest.approx(2 * (SLOW.intra.seconds(MiB) + SLOW.inter.seconds(MiB)))
    assert predict_on_links("naive", 4, MiB, SLOW) is None  # no two-level model for it


def _timed(comm, algorithm, x, reps=5):
    ae.allreduce(comm, x, "sum", algorithm)  # warm up
    times = []
    for _ in range(reps):
        comm.barrier()
        t0 = time.perf_counter()
        ae.allreduce(comm, x, "sum", algorithm)
        times.append(time.perf_counter() - t0)
    return times


def test_hierarchical_beats_the_ring_across_a_slow_network():
    x = np.ones(MiB // 4, np.float32)  # 1 MiB per rank
    with ae.Cluster(4, transport="local", links=SLOW) as cluster:
        ring, hier = (np.median(np.max(cluster.run(_timed, a, x), axis=0)) for a in ("ring", "hierarchical"))
    assert hier < 0.75 * ring, (hier, ring)  # the model: 14 ms against 42 ms


@pytest.mark.slow
def test_bench_on_a_2x2_topology_prints_the_model_beside_the_measured_rows(tmp_path):
    out = tmp_path / "rows.json"
    result = subprocess.run([sys.executable, "-m", "allreduce_edu.cli", "bench", "--topology", "2x2",
                             "--transport", "local", "--intra-link", "20us,10GB/s", "--inter-link",
                             "2ms,52.4288MB/s", "--algorithm", "ring,hierarchical,tree", "-b", "1M", "-e", "1M",
                             "--iters", "7", "--warmup", "2", "--json", str(out)], check=False, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "model" in result.stdout and "emulated links: 2 ranks per node" in result.stdout
    rows = {r["algorithm"]: r for r in json.loads(out.read_text())}
    assert rows["hierarchical"]["time_us"] < 0.75 * rows["ring"]["time_us"], result.stdout
    assert rows["hierarchical"]["model_us"] < rows["ring"]["model_us"] < rows["tree"]["model_us"]
    for name in ("ring", "hierarchical"):  # the links dominate the in-process transport: measured ≈ model
        assert rows[name]["model_us"] < rows[name]["time_us"] < 3 * rows[name]["model_us"]


def test_a_group_of_some_ranks_runs_its_own_collectives_and_the_world_stays_in_step(transport):
    from allreduce_edu.comm.group import Group

    def halves(comm):
        half = Group(comm, [0, 1] if comm.rank < 2 else [2, 3], f"half{comm.rank // 2}")
        summed = ae.allreduce(half, np.full(3, comm.rank + 1.0))  # each half on its own
        request = ae.iallreduce(half, np.full(2, 10.0 * (comm.rank + 1)))  # on the rank's thread
        # ranks 0 and 1 alone: ranks 2 and 3 never count this call, so the world's next one matches
        alone = ae.allreduce(Group(comm, [0, 1], "first"), np.ones(1)) if comm.rank < 2 else None
        world = ae.allreduce(comm, np.full(2, comm.rank + 1.0))
        return summed, request.wait(), alone, world

    results = cluster_for(transport, 4).run(halves)
    for rank, (summed, waited, alone, world) in enumerate(results):
        first = rank < 2
        assert summed.tolist() == [3.0 if first else 7.0] * 3
        assert waited.tolist() == [30.0 if first else 70.0] * 2
        assert (alone.tolist() == [2.0]) if first else alone is None
        assert world.tolist() == [10.0, 10.0]


def test_a_group_of_a_group_and_groups_of_one_name_keep_their_own_numbering():
    from allreduce_edu.comm.group import Group

    def nested(comm):
        outer = Group(comm, [0, 1, 2, 3], "a")
        if comm.rank < 2:  # a group of the group: ranks 2 and 3 of "a" never count its call
            ae.allreduce(Group(outer, [0, 1], "b"), np.ones(1))
        if comm.rank < 3:  # one name, two member lists: rank 1 is in both
            ae.allreduce(Group(comm, [0, 1], "pair"), np.ones(1)) if comm.rank < 2 else None
            ae.allreduce(Group(comm, [1, 2], "pair"), np.ones(1)) if comm.rank > 0 else None
        return ae.allreduce(outer, np.ones(2)).tolist()

    assert cluster_for("local", 4).run(nested) == [[4.0, 4.0]] * 4


def test_groups_number_their_calls_in_spaces_of_their_own():
    from allreduce_edu.comm.calls import Calls
    from allreduce_edu.comm.group import Group
    from allreduce_edu.comm.mailbox import Signature, earlier_in_space

    class One:  # what a Group reads of its parent at construction
        rank, world_size, links = 0, 2, None

    a, b = Group(One(), [0, 1], "a"), Group(One(), [0, 1], "a")  # as two members make it
    assert a.space == b.space != 0 and Group(One(), [0, 1], "b").space != a.space
    assert Group(One(), [0, 2], "a").space != a.space  # one name, other members: its own
    calls = Calls()
    world = calls.open(Signature("allreduce"), 1.0).collective_id
    grouped = calls.open(Signature("allreduce"), 1.0, space=a.space).collective_id
    world_next = calls.open(Signature("allreduce"), 1.0).collective_id
    assert (world, world_next) == (1, 2) and grouped != world  # the group's call took no world number
    assert earlier_in_space(world, world_next) and not earlier_in_space(world, grouped)


# --- one full-duplex port per rank (Links.flat), as the α-β model has it -------------------------
def test_flat_links_read_like_a_datasheet():
    links = Links.flat("1ms", "100MB/s")
    assert (links.uniform.alpha, links.uniform.beta) == pytest.approx((1e-3, 1e-8))
    assert Links.flat(2e-3, 50e6).uniform.seconds(50_000) == pytest.approx(3e-3)
    assert links.link(0, 7) == links.link(3, 2) == links.uniform and str(links).startswith("every link 1000 us")
    assert Links.two_level(2, "1ms,1GB/s", "2ms,1GB/s").uniform is None
    assert pickle.loads(pickle.dumps(links)) == links
    with pytest.raises(ValueError):
        Links.flat(1e-3, 0)
    # every algorithm's own formula applies on uniform links; two-level links need a link formula
    assert predict_on_links("naive", 4, 1e5, links) == pytest.approx(6 * (1e-3 + 1e5 * 1e-8))
    assert predict_on_links("naive", 4, 1e5, SLOW) is None


def _gather_to_rank_0(comm):
    comm.barrier()
    t0 = time.perf_counter()
    if comm.rank:
        comm.send(0, np.zeros(10_000, np.uint8), "gather")
    else:
        for src in range(1, comm.world_size):
            comm.recv(src, "gather")
    return time.perf_counter() - t0


@pytest.mark.parametrize("transport", ["local", pytest.param("shm", marks=pytest.mark.processes)])
def test_a_root_gathering_from_n_minus_1_ranks_waits_n_minus_1_link_times(transport):
    """Receives arrive one after another at the root's port, as costmodel's naive formula charges;
    without ingress, the root would wait one link time."""
    links = Links.flat("20ms", "1GB/s")  # 20.01 ms per 10 kB message
    with ae.Cluster(4, transport=transport, links=links) as cluster:
        root = cluster.run(_gather_to_rank_0)[0]
    one = links.uniform.seconds(10_000)
    # N - 1 link times, give or take the barrier's skew (the senders may leave it before the root
    # starts its clock); without ingress it would be about one
    assert 2.5 * one <= root < 4 * one, f"root waited {root * 1e3:.1f} ms; one link time {one * 1e3:.1f} ms"


def _cpu_over_a_long_send(comm):
    if comm.rank == 1:
        comm.recv(0, "long")
        return None
    wall, cpu = time.perf_counter(), time.process_time()
    comm.send(1, np.zeros(8, np.uint8), "long")
    return (time.process_time() - cpu) / (time.perf_counter() - wall)


@pytest.mark.processes
def test_an_emulated_wait_uses_no_cpu():
    """The sender sleeps to its deadline: its process spends under 5 % of the wait on the CPU,
    leaving the cores to the other ranks (a spin would take 100 %)."""
    with ae.Cluster(2, transport="shm", links=Links.flat("500ms", "1GB/s")) as cluster:
        share = cluster.run(_cpu_over_a_long_send)[0]
    assert share < 0.05, f"the waiting rank used {share:.0%} of a core"


def _ports_free_again(comm):
    """Ports are booked first come, first served: two senders to one receiver take turns."""
    comm.barrier()
    t0 = time.perf_counter()
    if comm.rank in (1, 2):
        comm.send(0, np.zeros(0, np.uint8), "turns")
    elif comm.rank == 0:
        comm.recv(1, "turns")
        comm.recv(2, "turns")
    return time.perf_counter() - t0


@pytest.mark.processes
def test_ports_are_shared_by_the_clusters_ranks_and_new_after_a_restart():
    links = Links.flat("30ms", "1GB/s")
    with ae.Cluster(3, transport="shm", links=links) as cluster:
        first = cluster.run(_ports_free_again)[0]
        cluster.restart()
        again = cluster.run(_ports_free_again)[0]
    for root in (first, again):
        assert 1.5 * 30e-3 <= root < 3 * 30e-3, root  # one port: the two took turns (± the barrier's skew)
    assert links.ports is None  # the caller's links stay a description; each world books its own


@pytest.mark.processes
def test_bench_on_flat_links_prints_the_links_model_and_the_fitted_one(tmp_path):
    out = tmp_path / "rows.json"
    result = subprocess.run([sys.executable, "-m", "allreduce_edu.cli", "bench", "-n", "2", "--transport", "local",
                             "--links", "2ms,1GB/s", "--algorithm", "ring,naive", "-b", "8", "-e", "8",
                             "--iters", "3", "--warmup", "1", "--json", str(out)],
                            check=False, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "emulated links: every link 2000 us" in result.stdout and "# fitted on these links: every link" in result.stdout
    [head] = [line for line in result.stdout.splitlines() if line.startswith("#") and "algorithm" in line]
    assert head.split()[-2:] == ["model", "fitted"], head
    rows = json.loads(out.read_text())
    assert all(r["model_us"] == pytest.approx(4000, rel=1e-3) and r["fit_us"] > 0 for r in rows), rows
    refused = subprocess.run([sys.executable, "-m", "allreduce_edu.cli", "bench", "--testbed", "--topology", "2x2"],
                             check=False, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "drop --topology" in refused.stderr
