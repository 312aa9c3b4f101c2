"""Lesson 03's checkers: a right answer passes, typical wrong ones fail with a specific hint."""

from __future__ import annotations

import numpy as np
import pytest

import allreduce_edu
from allreduce_edu.exercises import reference, registry
from allreduce_edu.exercises.lesson03 import (
    check_busbw_answer,
    check_owner_prediction,
    check_pipelined_ring,
    check_ring_allreduce,
    check_ring_bytes,
    ring_bytes_sent,
)

# wrong answers: the same checks on thread ranks, which start at once (the right answers run on gRPC)
QUICK = {"world_sizes": (3,), "timeout": 5.0, "transport": "local"}


ring = reference("03.1")  # the registered solution: the right answer every wrong one is a twist of


def ring_with_send_recv(comm, x):  # plain send then recv: fine here (sends are eager), and still a ring
    n, r = comm.world_size, comm.rank
    pieces = np.array_split(x.reshape(-1).copy(), n)
    for step in range(n - 1):
        comm.send((r + 1) % n, pieces[(r - step - 1) % n], tag="rs")
        pieces[(r - step - 2) % n] += comm.recv((r - 1) % n, tag="rs")
    for step in range(n - 1):
        comm.send((r + 1) % n, pieces[(r - step) % n], tag="ag")
        pieces[(r - step - 1) % n] = comm.recv((r - 1) % n, tag="ag")
    return np.concatenate(pieces).reshape(x.shape)


def forgot_step(comm, x):  # always sends chunk (r - 1) % n
    n, r = comm.world_size, comm.rank
    pieces = np.array_split(x.reshape(-1).copy(), n)
    for _ in range(n - 1):
        pieces[(r - 2) % n] += comm.sendrecv((r + 1) % n, pieces[(r - 1) % n], (r - 1) % n, tag="rs")
    for step in range(n - 1):
        pieces[(r - step - 1) % n] = comm.sendrecv((r + 1) % n, pieces[(r - step) % n], (r - 1) % n, tag="ag")
    return np.concatenate(pieces).reshape(x.shape)


def replaces(comm, x):  # = instead of += in reduce-scatter
    n, r = comm.world_size, comm.rank
    pieces = np.array_split(x.reshape(-1).copy(), n)
    for step in range(n - 1):
        pieces[(r - step - 2) % n] = comm.sendrecv((r + 1) % n, pieces[(r - step - 1) % n], (r - 1) % n, tag="rs")
    for step in range(n - 1):
        pieces[(r - step - 1) % n] = comm.sendrecv((r + 1) % n, pieces[(r - step) % n], (r - 1) % n, tag="ag")
    return np.concatenate(pieces).reshape(x.shape)


def adds_into_sent_piece(comm, x):  # reduces into the piece it sent, not the one that arrived
    n, r = comm.world_size, comm.rank
    pieces = np.array_split(x.reshape(-1).copy(), n)
    for step in range(n - 1):
        pieces[(r - step - 1) % n] += comm.sendrecv((r + 1) % n, pieces[(r - step - 1) % n], (r - 1) % n, tag="rs")
    for step in range(n - 1):
        pieces[(r - step - 1) % n] = comm.sendrecv((r + 1) % n, pieces[(r - step) % n], (r - 1) % n, tag="ag")
    return np.concatenate(pieces).reshape(x.shape)


def no_copy(comm, x):  # array_split returns views of x: += writes into the caller's array
    n, r = comm.world_size, comm.rank
    pieces = np.array_split(x.reshape(-1), n)
    for step in range(n - 1):
        pieces[(r - step - 2) % n] += comm.sendrecv((r + 1) % n, pieces[(r - step - 1) % n], (r - 1) % n, tag="rs")
    for step in range(n - 1):
        pieces[(r - step - 1) % n] = comm.sendrecv((r + 1) % n, pieces[(r - step) % n], (r - 1) % n, tag="ag")
    return np.concatenate(pieces).reshape(x.shape)


def one_step_too_many(comm, x):
    n, r = comm.world_size, comm.rank
    pieces = np.array_split(x.reshape(-1).copy(), n)
    for step in range(n):
        pieces[(r - step - 2) % n] += comm.sendrecv((r + 1) % n, pieces[(r - step - 1) % n], (r - 1) % n, tag="rs")
    for step in range(n):
        pieces[(r - step - 1) % n] = comm.sendrecv((r + 1) % n, pieces[(r - step) % n], (r - 1) % n, tag="ag")
    return np.concatenate(pieces).reshape(x.shape)


def flat_result(comm, x):
    return ring(comm, x).reshape(-1)


def tags_disagree(comm, x):
    n, r = comm.world_size, comm.rank
    comm.send((r + 1) % n, x, tag="rs")
    return comm.recv((r - 1) % n, tag="reduce_scatter")


def library(comm, x):
    return allreduce_edu.allreduce(comm, x)


@pytest.mark.processes
def test_right_ring_passes_and_reports_bytes():
    feedback = check_ring_allreduce(ring, shapes=((10,), (100_003,), (2, 5)))  # the notebook runs 1,000,003
    assert feedback, feedback
    assert "rank 0 sent 1200032 bytes" in feedback.message and "= 1200036" in feedback.message


def test_ring_built_from_send_and_recv_passes():
    assert check_ring_allreduce(ring_with_send_recv, shapes=((10,), (2, 5)), **QUICK)


@pytest.mark.parametrize("fn, words", [
    (forgot_step, ["sends chunk 2 at step 1 of reduce-scatter but should send chunk 1", "index you send"]),
    (replaces, ["own data is missing", "+="]),
    (adds_into_sent_piece, ["different lengths", "pieces[(rank − step − 2) % N]"]),
    (no_copy, ["input x changed", ".copy()"]),
    (one_step_too_many, ["sent 6 messages", "range(N − 1)"]),
    (flat_result, ["returned shape (10,)", "x.shape"]),
    (tags_disagree, ["never came", "same tag"]),
    (library, ["comm.collective", "not available"]),
])
def test_wrong_rings_get_specific_hints(fn, words):
    shapes = ((2, 5),) if fn is flat_result else ((10,),)
    timeout = 1.5 if fn is tags_disagree else QUICK["timeout"]  # it waits out the deadline
    feedback = check_ring_allreduce(fn, shapes=shapes, **{**QUICK, "timeout": timeout})
    assert not feedback
    for word in words:
        assert word in feedback.message, feedback


def pipelined(comm, x, segments=2):
    n, r = comm.world_size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    pieces = [np.array_split(p, segments) for p in np.array_split(x.reshape(-1).copy(), n)]
    for step in range(n - 1):
        out, into = (r - step - 1) % n, (r - step - 2) % n
        sends = [comm.isend(right, seg, tag="rs") for seg in pieces[out]]
        for seg in pieces[into]:
            seg += comm.recv(left, tag="rs")
        for request in sends:
            request.wait()
    for step in range(n - 1):
        out, into = (r - step) % n, (r - step - 1) % n
        sends = [comm.isend(right, seg, tag="ag") for seg in pieces[out]]
        pieces[into] = [comm.recv(left, tag="ag") for _ in range(segments)]
        for request in sends:
            request.wait()
    return np.concatenate([np.concatenate(p) for p in pieces]).reshape(x.shape)


def pipelined_reversed_segments(comm, x):  # stores the two segments of each gathered chunk swapped
    n, r = comm.world_size, comm.rank
    pieces = [np.array_split(p, 2) for p in np.array_split(x.reshape(-1).copy(), n)]
    for step in range(n - 1):
        out, into = (r - step - 1) % n, (r - step - 2) % n
        for k in range(2):
            pieces[into][k] += comm.sendrecv((r + 1) % n, pieces[out][k], (r - 1) % n, tag="rs")
    for step in range(n - 1):
        out, into = (r - step) % n, (r - step - 1) % n
        got = [comm.sendrecv((r + 1) % n, pieces[out][k], (r - 1) % n, tag="ag") for k in range(2)]
        pieces[into] = got[::-1] if step == n - 2 else got
    return np.concatenate([np.concatenate(p) for p in pieces]).reshape(x.shape)


@pytest.mark.processes
def test_pipelined_checker():
    assert check_pipelined_ring(pipelined, shapes=((10,), (1001,)))
    plain = check_pipelined_ring(ring, shapes=((10,),), **QUICK)
    assert not plain and "plain ring" in plain.message, plain
    swapped = check_pipelined_ring(pipelined_reversed_segments, shapes=((1001,),), **QUICK)
    assert not swapped and "wrong place" in swapped.message and "same place" in swapped.message, swapped


def test_owner_prediction():
    assert check_owner_prediction(1)  # after 2 of 3 steps chunk 2 is on rank 1: 3 → 0 → 1
    assert "starts" in check_owner_prediction(3).message
    assert "end of reduce-scatter" in check_owner_prediction(2).message  # the finished owner: one hop too far
    assert "after 1 step, with the data of 2 ranks" in check_owner_prediction(0).message
    assert "0 to 3" in check_owner_prediction(7).message
    assert "answer with a number" in check_owner_prediction("two").message


def test_owner_prediction_at_other_steps():
    assert check_owner_prediction(2, steps=3)  # the end of reduce-scatter: rank r owns chunk r
    assert "last step" not in check_owner_prediction(2, steps=3).message
    assert check_owner_prediction(0, steps=1)
    assert "only after 2 steps" in check_owner_prediction(1, steps=1).message


MIB = 1 << 20


S = 1_000_003 * 8  # 03.2: 1,000,003 float64 elements on 16 ranks
RIGHT = (30 * 62_500 + 4) * 8


@pytest.mark.parametrize("answer, hint", [(2 * 15 / 16 * S, "formula for equal chunks"),
                                          (30 * 62_500 * 8, "as a short one"), (30 * 62_501 * 8, "as a long one"),
                                          (RIGHT / MIB, "MiB"), (2 * S, "limit"), (15 * S, "naive root"),
                                          (30, "number of messages"), (123, "not it")])
def test_ring_bytes(answer, hint):
    assert check_ring_bytes(RIGHT) and ring_bytes_sent(1_000_003, 16) == RIGHT
    feedback = check_ring_bytes(answer)
    assert not feedback and hint in feedback.message, feedback


def test_ring_bytes_counts_what_the_ring_really_sends():
    from allreduce_edu.runtime import Cluster

    n, count = 5, 1003  # uneven: 3 long chunks of 201, 2 short of 200
    with Cluster(n, "local") as cluster:
        cluster.run(lambda comm: ring(comm, np.zeros(count)))
        sent = cluster.trace.bytes_sent()
    assert [sent[r] for r in range(n)] == [ring_bytes_sent(count, n, r) for r in range(n)]


def test_busbw_answer():
    assert check_busbw_answer("d")
    assert "shrink to S/N" in check_busbw_answer("a").message
    assert "9× as many steps" in check_busbw_answer("b").message
    assert "close, but not exactly" in check_busbw_answer("c").message
    assert "'a', 'b', 'c' or 'd'" in check_busbw_answer("e").message


def test_solutions_are_registered_and_the_ring_solution_runs():
    for key in ("03.0", "03.1", "03.2", "03.3", "03.4"):
        assert registry.get(key).solution
    ring_from_text = reference("03.1")
    assert ring_from_text.__name__ == "my_ring_allreduce"
    with allreduce_edu.Cluster(3, transport="local") as cluster:
        results = cluster.run(lambda comm: ring_from_text(comm, np.arange(7.0) * (comm.rank + 1)))
    assert all(np.array_equal(r, np.arange(7.0) * 6) for r in results)


def test_every_checker_answers_not_attempted_for_its_scaffold():
    def my_ring_allreduce(comm, x):
        """The scaffold, as lesson 03 ships it."""
        ...

    for feedback in (check_owner_prediction(None), check_ring_allreduce(my_ring_allreduce), check_ring_bytes(None),
                     check_pipelined_ring(my_ring_allreduce), check_busbw_answer("?")):
        assert not feedback and not feedback.attempted and "hint(" in feedback.message
    assert reference("03.3").__name__ == "my_pipelined_ring"
    assert check_pipelined_ring(reference("03.3"), shapes=((10,),), transport="local")


def lesson_cells():
    from allreduce_edu import course

    [path] = [p for p in course.lesson_files() if p.name.startswith("03")]
    cells = course.read(path)["cells"]
    at = {c["metadata"]["exercise"]: i for i, c in enumerate(cells) if "exercise" in c.get("metadata", {})}
    return cells, at, course.source


def test_the_learner_traces_chunks_then_writes_the_ring_before_seeing_one():
    """03.0 (follow a chunk in the animation) comes before 03.1, and nothing above 03.1 shows a ring
    in code: the library's listing comes after its check cell (issue 24, the walkthrough's #10)."""
    cells, at, source = lesson_cells()
    assert at["03.0"] < at["03.1"]
    shown = "\n".join(source(c) + "".join(str(o) for o in c.get("outputs", [])) for c in cells[:at["03.1"]])
    for giveaway in ("show_source", "reduce_scatter_ring", "all_gather_ring", "collectives.ring",
                     "pieces[", "comm.sendrecv(right"):
        assert giveaway not in shown, giveaway
    later = "\n".join(source(c) for c in cells[at["03.1"] + 1:])
    assert "show_source(allreduce_ring_plain)" in later


def test_predictions_come_before_what_answers_them():
    """The objective does not state the bytes formula 03.a asks for; nor does anything before 03.b
    state t_ring, which follows the measurement that answers it."""
    cells, _, source = lesson_cells()
    text = [source(c) for c in cells]
    asked = {key: next(i for i, t in enumerate(text) if f'predict("{key}"' in t) for key in ("03.a", "03.b")}
    assert not any("2(N−1)/N·S" in t or "2(N − 1)/N · S" in t for t in text[:asked["03.a"]])
    t_ring = "t_ring = 2(N − 1)·α + 2(N − 1)/N·S·β"
    assert not any(t_ring in t for t in text[:asked["03.b"] + 1])
    assert any(t_ring in t for t in text[asked["03.b"] + 1:])
