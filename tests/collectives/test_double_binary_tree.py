"""The double binary tree: NCCL's two trees exactly, each rank interior in at most one, every message where the
schedule puts it, bytes per rank as the formula says, on every transport, animated in two colours."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import check_allreduce, cluster_for

import allreduce_edu as ae
from allreduce_edu.collectives.double_binary_tree import (
    NOMINAL,
    PIPELINE_BYTES,
    Tree,
    btree,
    double_binary_tree,
    mirror_tree,
    pipeline_chunks,
    programs,
    schedule,
    trees,
)
from allreduce_edu.model import costmodel, portsim
from allreduce_edu.model.links import Link, Links
from allreduce_edu.viz import DoubleTreeAnimation, animate
from allreduce_edu.viz.layouts import TREE_COLOURS
from allreduce_edu.viz.replay import replay

# parents, read off the pictures in NCCL's src/graph/trees.cc (-1: the root)
NCCL_12_TREE_1 = [-1, 2, 4, 2, 8, 6, 4, 6, 0, 10, 8, 10]
NCCL_12_TREE_2 = [1, 3, 1, 11, 5, 7, 5, 3, 9, 7, 9, -1]  # the mirror: even N
NCCL_13_TREE_1 = [-1, 2, 4, 2, 8, 6, 4, 6, 0, 10, 12, 10, 8]
NCCL_13_TREE_2 = [9, -1, 3, 5, 3, 9, 7, 5, 7, 1, 11, 0, 11]  # shifted by one: odd N


@pytest.mark.parametrize("n, first, second", [(12, NCCL_12_TREE_1, NCCL_12_TREE_2),
                                              (13, NCCL_13_TREE_1, NCCL_13_TREE_2)])
def test_the_trees_are_nccls(n, first, second):
    assert [btree(n, r)[0] for r in range(n)] == first
    assert [mirror_tree(n, r)[0] for r in range(n)] == second
    for shape in (btree, mirror_tree):  # children and parents agree
        for r in range(n):
            assert all(shape(n, c)[0] == r for c in shape(n, r)[1])


@pytest.mark.parametrize("n", range(1, 34))
def test_every_rank_is_interior_in_at_most_one_tree(n):
    first, second = trees(n)
    assert sorted(first.parent).count(-1) == 1 and sorted(second.parent).count(-1) == 1
    assert all(len(c) <= 2 for t in (first, second) for c in t.children)
    both = [r for r in range(n) if first.children[r] and second.children[r]]
    # odd N: rank 0, tree 1's root, also plays tree 1's last rank in tree 2; one child in each
    assert both == ([0] if n % 2 and n > 1 else [])
    if both:
        assert len(first.children[0]) == len(second.children[0]) == 1
    assert all(len(first.children[r]) + len(second.children[r]) <= 2 for r in range(n))
    assert first.height[first.root] == second.height[second.root] == (n - 1).bit_length()


@pytest.mark.parametrize("shape, words", [
    (lambda n, r: (-1, []), "one root"),
    (lambda n, r: (r - 1, [r + 1] if r + 1 < n else []) if r else (-1, [2]), "rank 0 names 2 as a child"),
    (lambda n, r: (r - 1, []) if r else (-1, []), "rank 1 names 0 as its parent, but"),
    (lambda n, r: [(-1, [3]), (2, [2]), (1, [1]), (0, [])][r], r"ranks \[1, 2\] cannot be reached"),  # a cycle
])
def test_a_wrong_shape_is_refused_saying_what_disagrees(shape, words):
    with pytest.raises(ValueError, match=words):
        Tree.of(4, shape)
    assert Tree.of(4, lambda n, r: (r - 1, [r + 1] if r + 1 < n else [])).height == (3, 2, 1, 0)  # a chain


def _dbt(comm, size, dtype, chunks):
    x = (np.arange(size) % 7 + comm.rank).astype(dtype)
    return double_binary_tree(comm, x, chunks=chunks)


@pytest.mark.parametrize("n", range(1, 10))
@pytest.mark.parametrize("chunks", [1, 3])
def test_messages_follow_the_schedule_and_bytes_follow_the_formula(n, chunks):
    size, dtype = 1000, np.float32
    cluster = cluster_for("local", n)
    results = cluster.run(_dbt, size, dtype, chunks)
    expected = sum((np.arange(size) % 7 + r).astype(dtype) for r in range(n))
    assert all(np.array_equal(y, expected) for y in results)
    events = cluster.trace.events
    assert sorted((e.step, e.tag, e.chunk[0], e.src, e.dst) for e in events) == sorted(schedule(n, chunks))
    if n > 1:  # each phase: K + height - 1 steps
        height = (n - 1).bit_length()
        for tag in ("reduce", "broadcast"):
            assert {e.step for e in events if e.tag == tag} == set(range(chunks + height - 1))
    pieces = [len(p) * np.dtype(dtype).itemsize for p in np.array_split(np.empty(size), 2 * chunks)]
    halves = [sum(pieces[:chunks]), sum(pieces[chunks:])]
    sent = cluster.trace.bytes_sent()
    for r in range(n):
        formula = sum(((t.parent[r] >= 0) + len(t.children[r])) * half for t, half in zip(trees(n), halves))
        assert sent.get(r, 0) == formula
        assert formula <= 4 * max(halves)  # 2·S per rank, never more (halves may differ by a few elements)


def test_the_pipeline_cuts_big_buffers_into_chunks():
    assert pipeline_chunks(0) == pipeline_chunks(2 * PIPELINE_BYTES) == 1
    assert pipeline_chunks(16 * PIPELINE_BYTES) == 4 and pipeline_chunks(1 << 40) == 64
    cluster = cluster_for("local", 4)
    count = 16 * PIPELINE_BYTES // 4  # float32: 4 chunks per tree
    cluster.run(lambda comm: ae.allreduce(comm, np.ones(count, np.float32), algorithm="double_binary_tree"))
    assert max(e.chunk[1] for e in cluster.trace.events) == 8


def test_the_cost_runs_every_ranks_program_on_one_port_per_rank():
    alpha, beta = 10e-3, 1 / 100e6  # the course's testbed
    # N = 2, one chunk: each rank sends its half up one tree, then gets the other half down
    assert costmodel.predict("double_binary_tree", 2, 1000, alpha, beta) == pytest.approx(2 * (alpha + 500 * beta))
    t = {(a, s): costmodel.predict(a, 8, s, alpha, beta)
         for a in ("ring", "tree", "double_binary_tree") for s in (64, 1 << 26, 1 << 28)}
    assert t["double_binary_tree", 64] < t["ring", 64]  # logarithmic steps
    assert t["double_binary_tree", 1 << 28] < 0.5 * t["tree", 1 << 28]  # 2·S per port, the tree's 6·S at N = 8
    # α on the ports: every chunk pays it at every port it crosses, so the ring stays ahead
    assert 1.2 < t["double_binary_tree", 1 << 28] / t["ring", 1 << 28] < 2
    assert t["double_binary_tree", 1 << 28] > 2 * (1 << 28) * beta  # never under the bytes one port moves


def test_in_flight_the_trees_pay_alpha_per_hop_not_per_chunk():
    flight, stored = ae.TESTBED_IN_FLIGHT, ae.TESTBED
    p = {(a, s, links is flight): costmodel.predict_on_links(a, 8, s, links)
         for a in ("ring", "tree", "double_binary_tree") for s in (8, 16 << 20)
         for links in (flight, stored)}
    # 8 B: both phases climb the trees' 3 levels, one α each, like the binomial tree's 2·log2 N
    assert p["double_binary_tree", 8, True] == pytest.approx(p["tree", 8, True], rel=0.01)
    assert p["double_binary_tree", 8, False] > 1.5 * p["tree", 8, False]  # 2 children: 2α per level
    # 16 MiB: the pipeline's K chunks pay α once, not once each
    assert p["double_binary_tree", 16 << 20, True] < 1.2 * p["ring", 16 << 20, True]
    assert p["double_binary_tree", 16 << 20, False] > 1.5 * p["ring", 16 << 20, False]
    assert pipeline_chunks(16 << 20, flight.inter) == 11 > pipeline_chunks(16 << 20, stored.inter) == 4


@pytest.mark.parametrize("n", range(1, 10))
@pytest.mark.parametrize("chunks", [1, 3, 16])
def test_every_ranks_program_is_a_schedule_that_finishes(n, chunks):
    """Each rank's order of sends and receives, replayed on both kinds of link: nobody waits for a
    message that is never sent (portsim.run raises on a deadlock), and each message once."""
    for link in (NOMINAL, ae.TESTBED_IN_FLIGHT.inter, Link(0.0, 1e-9)):
        progs = programs(n, chunks, float(1 << 20), link)
        sends = [op[2] for p in progs for op in p if op[0] == "send"]
        receives = [op[2] for p in progs for op in p if op[0] == "recv"]
        assert sorted(sends) == sorted(receives) == sorted(schedule_keys(n, chunks))
        assert portsim.run(progs, lambda src, dst, link=link: link) >= 0


def schedule_keys(n, chunks):
    return [(step, tag, piece, src, dst) for step, tag, piece, src, dst in schedule(n, chunks)]


@pytest.mark.parametrize("n", [2, 5, 8, 9])
def test_on_in_flight_links_the_result_is_the_sum(n):
    links = Links.flat("1ms", "1GB/s", in_flight=True)  # the courier posts each message on arrival
    with ae.Cluster(n, transport="local", links=links) as cluster:
        for size in (2, 3 << 18):
            x = [np.arange(size, dtype=np.int64) * (r + 1) for r in range(n)]
            out = cluster.run(lambda comm, x=x: double_binary_tree(comm, x[comm.rank]))
            assert all(np.array_equal(y, sum(x)) for y in out)


@pytest.mark.processes
@pytest.mark.parametrize("processes", ["grpc", "shm"])
@pytest.mark.parametrize("n", [2, 5, 8])
def test_more_world_sizes_on_process_transports(processes, n):
    cluster = cluster_for(processes, n)
    for size, op, dtype in [(0, "sum", "float32"), (n + 1, "max", "int64"), (1009, "prod", "float64")]:
        check_allreduce(cluster, "double_binary_tree", op, (size,), dtype, seed=size)
    results = cluster.run(_dbt, 200_000, np.float32, 5)  # pipelined, and streamed through segments on shm
    assert all(np.array_equal(y, results[0]) for y in results)


def test_the_animation_draws_two_trees_in_two_colours():
    n = 8
    cluster = cluster_for("local", n)
    x = [np.arange(8.0) + 10 * r for r in range(n)]
    cluster.run(lambda comm: double_binary_tree(comm, x[comm.rank], chunks=2))
    view = animate(cluster, values=x)
    assert isinstance(view, DoubleTreeAnimation) and view.chunks == 4
    edges = view.data["edges"]
    assert sorted(e[2] for e in edges) == sorted([TREE_COLOURS[0]] * (n - 1) + [TREE_COLOURS[1]] * (n - 1))
    assert all(c in view.to_html() for c in TREE_COLOURS)
    ys = {r: y for r, (_, y) in enumerate(view.positions)}
    assert ys[0] == max(ys.values()) and ys[trees(n)[1].root] == min(ys.values())  # roots at top and bottom
    assert all(ys[r] > ys[r + 1] for r in range(0, n, 2))  # tree 1's interior ranks above its leaves
    states = replay(cluster.trace, n, values=x)
    assert np.array_equal(states[-1].values[3][1], sum(np.array_split(xi, 4)[1] for xi in x))
    frames = [view.frame(i) for i in range(len(states))]
    assert len(set(frames)) == len(frames)


@pytest.mark.parametrize("n", [1, 2, 3, 9])
def test_every_world_size_lays_out_inside_the_picture(n):
    cluster = cluster_for("local", n)
    cluster.run(lambda comm: ae.allreduce(comm, np.ones(6), algorithm="double_binary_tree"))
    view = animate(cluster)
    xs = [x for x, _ in view.positions]
    assert min(xs) - view.box_w / 2 >= 0 and max(xs) + view.box_w / 2 <= 7.2
    assert view.frame(len(view.states) - 1).startswith(b"\x89PNG")


def _disagree(comm):
    return ae.allreduce(comm, np.ones(4), algorithm="bruck" if comm.rank == 2 else "double_binary_tree")


def test_ranks_disagreeing_on_the_algorithm_raise_mismatch(transport):
    with pytest.raises(ae.CollectiveMismatch) as info:
        cluster_for(transport, 4).run(_disagree)
    assert "rank 2 called" in str(info.value) and "algorithm='bruck'" in str(info.value), str(info.value)
    assert 2 in info.value.ranks


@pytest.mark.parametrize("inter", ["double_binary_tree", "bruck"])
def test_the_new_algorithms_run_between_nodes_in_hierarchical(inter):
    from allreduce_edu.collectives.hierarchical import hierarchical

    x = [np.arange(10.0) * (r + 1) for r in range(6)]
    results = cluster_for("local", 6).run(lambda comm: hierarchical(comm, x[comm.rank], "sum", 2, inter))
    assert all(np.array_equal(y, np.arange(10.0) * 21) for y in results)


def test_gamma_is_paid_per_byte_reduced():
    """The reduce work is γ per byte: the root of a tree alone adds its children's halves."""
    s, alpha, beta, gamma = 64 << 20, 1e-5, 1e-9, 1e-9
    dbt = costmodel.COSTS["double_binary_tree"]
    assert dbt(8, s, alpha, beta, gamma) - dbt(8, s, alpha, beta, 0.0) >= gamma * s / 2
