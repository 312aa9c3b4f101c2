"""replay(): per-step buffer states from traces of every algorithm, local and gRPC, sets and real values."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import cluster_for

import allreduce_edu as ae
from allreduce_edu.trace import Event, Trace
from allreduce_edu.viz.replay import chunk_bounds, replay

ALGORITHMS = ["ring", "tree", "naive", "all_to_all", "recursive_doubling", "rabenseifner", "double_binary_tree",
              "bruck"]
WORLD_SIZES = range(1, 9)


def inputs(world_size: int, length: int = 11) -> list[np.ndarray]:
    """Rank r contributes r*100 + 0..length-1: every element of every rank is different."""
    return [np.arange(length, dtype=np.float64) + 100 * r for r in range(world_size)]


def run(algorithm: str, world_size: int, transport: str = "local", op: str = "sum", length: int = 11):
    """(trace, per-rank inputs, per-rank results) of one all-reduce."""
    cluster = cluster_for(transport, world_size)
    x = inputs(world_size, length)
    results = cluster.run(lambda comm: ae.allreduce(comm, x[comm.rank], op=op, algorithm=algorithm))
    return cluster.trace, x, results


def summary(states) -> list:
    """What a replay says, without timestamps: phase, step, sets, and the messages (src, dst, chunk, bytes)."""
    return [(s.phase, s.step, s.held, sorted((m.src, m.dst, m.chunk, m.nbytes) for m in s.messages)) for s in states]


def test_replay_is_reexported_from_trace():
    from allreduce_edu.viz.replay import replay as from_trace

    assert from_trace is replay


@pytest.mark.parametrize("world_size", range(2, 9))
def test_ring_reduce_scatter_leaves_rank_r_owning_chunk_r(world_size):
    trace, _, _ = run("ring", world_size)
    states = replay(trace, world_size)
    after = [s for s in states if s.phase == "reduce_scatter"][-1]
    assert after.step == world_size - 2
    everyone = frozenset(range(world_size))
    for rank, row in enumerate(after.held):
        full = [c for c, ranks in enumerate(row) if ranks == everyone]
        assert full == [rank], f"rank {rank} holds fully reduced chunks {full}"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_every_algorithm_ends_with_every_chunk_everywhere(algorithm, world_size):
    trace, _, _ = run(algorithm, world_size)
    states = replay(trace, world_size)
    everyone = frozenset(range(world_size))
    assert states[0].held == tuple(tuple(frozenset({r}) for _ in row) for r, row in enumerate(states[0].held))
    assert all(ranks == everyone for row in states[-1].held for ranks in row)
    assert states[-1].sent == tuple(trace.bytes_sent().get(r, 0) for r in range(world_size))
    assert sum(len(s.messages) for s in states) == len(trace.events)


def test_steps_follow_the_algorithms_phases():
    trace, _, _ = run("ring", 4)
    assert [s.caption for s in replay(trace, 4)] == [
        "start: every rank holds only its own data",
        "reduce-scatter, step 0 (steps 0–2)", "reduce-scatter, step 1 (steps 0–2)",
        "reduce-scatter, step 2 (steps 0–2)",
        "all-gather, step 0 (steps 0–2)", "all-gather, step 1 (steps 0–2)", "all-gather, step 2 (steps 0–2)"]
    # one numbering: a state's step is its messages' step in the trace
    assert all(e.step == s.step for s in replay(trace, 4) for e in s.messages)
    trace, _, _ = run("rabenseifner", 6)
    assert [(s.phase, s.step) for s in replay(trace, 6)][1:] == [
        ("fold", 0), ("reduce_scatter", 0), ("reduce_scatter", 1), ("all_gather", 0), ("all_gather", 1), ("unfold", 0)]


def test_fold_comes_first_even_when_other_ranks_start_earlier():
    """Ranks that do not fold may start exchanging before the fold's send is timed: order by phase, not clock."""
    events = [Event(2, 1, "exchange", 0, 8, 0.0, 1.0), Event(1, 2, "exchange", 0, 8, 0.0, 1.0),
              Event(0, 1, "fold", 0, 8, 0.5, 0.6), Event(1, 0, "unfold", 0, 8, 2.0, 2.1)]
    states = replay(Trace(events), 3)
    assert [s.phase for s in states] == ["", "fold", "exchange", "unfold"]
    assert all(ranks == {0, 1, 2} for row in states[-1].held for ranks in row)
    assert states[2].held[0] == (frozenset({0}),)  # rank 0 keeps its own set until the unfold


def test_a_message_carries_what_its_sender_held_when_the_step_began():
    # both directions of one swap in one step: each side gets the other's *old* set
    events = [Event(0, 1, "exchange", 0, 8, 0.0, 1.0), Event(1, 0, "exchange", 0, 8, 0.0, 1.0),
              Event(1, 2, "exchange", 1, 8, 1.0, 2.0)]
    states = replay(Trace(events), 3)
    assert states[1].held == ((frozenset({0, 1}),), (frozenset({0, 1}),), (frozenset({2}),))
    assert states[2].held[2] == (frozenset({0, 1, 2}),)


def test_a_chunk_message_only_touches_its_chunks():
    states = replay(Trace([Event(0, 1, "reduce_scatter", 0, 8, 0.0, 1.0, chunk=(1, 3))]), 2, 4)
    assert states[1].held[1] == (frozenset({1}), frozenset({0, 1}), frozenset({0, 1}), frozenset({1}))


@pytest.mark.processes
@pytest.mark.parametrize("algorithm", ["ring", "tree", "rabenseifner"])
def test_grpc_and_local_traces_replay_to_the_same_states(algorithm):
    local, _, _ = run(algorithm, 4, "local")
    remote, _, _ = run(algorithm, 4, "grpc")
    assert summary(replay(remote, 4)) == summary(replay(local, 4))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("world_size", [1, 3, 4, 6, 8])
def test_values_match_numpy_and_the_real_result(algorithm, world_size):
    trace, x, results = run(algorithm, world_size)
    states = replay(trace, world_size, values=x)
    expected = np.sum(x, axis=0)
    for rank in range(world_size):
        np.testing.assert_allclose(np.concatenate(states[-1].values[rank]), expected)
        np.testing.assert_allclose(np.concatenate(states[-1].values[rank]), results[rank])
    flats = [v.reshape(-1) for v in x]
    bounds = chunk_bounds(flats[0].size, len(states[0].held[0]), algorithm)
    for state in states:  # every intermediate value is the sum over exactly the ranks in its set
        for rank, row in enumerate(state.held):
            for c, ranks in enumerate(row):
                piece = slice(bounds[c], bounds[c + 1])
                np.testing.assert_allclose(state.values[rank][c], np.sum([flats[r][piece] for r in ranks], axis=0))


def test_values_with_max_and_a_2d_buffer():
    cluster = cluster_for("local", 3)
    x = [np.arange(12.0).reshape(3, 4) * (-1) ** r + r for r in range(3)]
    cluster.run(lambda comm: ae.allreduce(comm, x[comm.rank], op="max", algorithm="ring"))
    final = replay(cluster.trace, 3, values=x, op="max")[-1]
    np.testing.assert_array_equal(np.concatenate(final.values[0]), np.max(x, axis=0).reshape(-1))


def test_world_size_and_chunks_are_inferred():
    trace, _, _ = run("ring", 5)
    assert len(replay(trace)[0].held) == 5 and len(replay(trace)[0].held[0]) == 5
    trace, _, _ = run("tree", 5)
    assert len(replay(trace)[0].held[0]) == 1
    trace, _, _ = run("rabenseifner", 6)
    assert len(replay(trace, 6)[0].held[0]) == 4  # blocks over p = 4 folded ranks


def test_a_world_of_one_has_only_the_initial_state():
    trace, x, _ = run("ring", 1)
    states = replay(trace, 1, values=x)
    assert len(states) == 1 and states[0].held == ((frozenset({0}),),)
    np.testing.assert_array_equal(states[0].values[0][0], x[0])


def test_bad_traces_are_refused_with_advice():
    cluster = cluster_for("local", 3)
    cluster.run(lambda comm: [ae.allreduce(comm, np.ones(3), algorithm=a) for a in ("ring", "tree")])
    with pytest.raises(ValueError, match="collective="):
        replay(cluster.trace, 3)
    assert replay(cluster.trace, 3, collective="allreduce/tree")[-1].phase == "broadcast"
    cluster.run(lambda comm: [ae.allreduce(comm, np.ones(3), algorithm="ring") for _ in range(2)])
    with pytest.raises(ValueError, match="one collective per cluster.run"):
        replay(cluster.trace, 3)
    trace, _, _ = run("ring", 4)
    with pytest.raises(ValueError, match="world of 3 ranks"):
        replay(trace, 3)
    with pytest.raises(ValueError, match="one initial array per rank"):
        replay(trace, 4, values=inputs(3))
