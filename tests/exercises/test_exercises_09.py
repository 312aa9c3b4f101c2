"""Lesson 09's checkers: a right answer passes, typical wrong ones fail with a specific hint."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from allreduce_edu import course
from allreduce_edu.exercises import lesson09, reference, registry
from allreduce_edu.exercises.lesson09 import (
    NAMES_SCAFFOLD,
    SCENARIO,
    TORCH_NAMES,
    check_hierarchical_prediction,
    check_in_network_answer,
    check_ring_on_engine,
    check_torch_names,
    scenario_seconds,
)
from allreduce_edu.runtime.engines import engine_available, missing

# on MPI (starts in about a second); small sizes, except where a big message is the point
QUICK = {"engine": "mpi", "world_sizes": (3,), "sizes": (10, 1001)}


def ring(comm, x):
    n, r = comm.world_size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    chunks = np.array_split(x.reshape(-1).copy(), n)
    for step in range(n - 1):
        out, into = (r - step - 1) % n, (r - step - 2) % n
        chunks[into] += comm.sendrecv(right, chunks[out], left, tag="rs")
    for step in range(n - 1):
        out, into = (r - step) % n, (r - step - 1) % n
        chunks[into] = comm.sendrecv(right, chunks[out], left, tag="ag")
    return np.concatenate(chunks).reshape(x.shape)


def blog_ring(comm, x):  # the lesson's given ring: reshape(n, -1), in place, send then recv
    n, r = comm.world_size, comm.rank
    chunks = x.reshape(n, -1)
    for step in range(n - 1):
        comm.send((r + 1) % n, chunks[(r - step - 1) % n], tag="rs")
        chunks[(r - step - 2) % n] += comm.recv((r - 1) % n, tag="rs")
    for step in range(n - 1):
        comm.send((r + 1) % n, chunks[(r - step) % n], tag="ag")
        chunks[(r - step - 1) % n] = comm.recv((r - 1) % n, tag="ag")
    return chunks.reshape(x.shape)


def send_then_recv(comm, x):  # right on gRPC (eager sends), a deadlock on engines for big messages
    n, r = comm.world_size, comm.rank
    chunks = np.array_split(x.reshape(-1).copy(), n)
    for step in range(n - 1):
        comm.send((r + 1) % n, chunks[(r - step - 1) % n], tag="rs")
        chunks[(r - step - 2) % n] += comm.recv((r - 1) % n, tag="rs")
    for step in range(n - 1):
        comm.send((r + 1) % n, chunks[(r - step) % n], tag="ag")
        chunks[(r - step - 1) % n] = comm.recv((r - 1) % n, tag="ag")
    return np.concatenate(chunks).reshape(x.shape)


def in_place(comm, x):  # array_split of x itself: += writes into the caller's x
    n, r = comm.world_size, comm.rank
    chunks = np.array_split(x.reshape(-1), n)
    for step in range(n - 1):
        out, into = (r - step - 1) % n, (r - step - 2) % n
        chunks[into] += comm.sendrecv((r + 1) % n, chunks[out], (r - 1) % n, tag="rs")
    for step in range(n - 1):
        out, into = (r - step) % n, (r - step - 1) % n
        chunks[into] = comm.sendrecv((r + 1) % n, chunks[out], (r - 1) % n, tag="ag")
    return np.concatenate(chunks).reshape(x.shape)


def reduce_scatter_only(comm, x):  # forgets the all-gather
    n, r = comm.world_size, comm.rank
    chunks = np.array_split(x.reshape(-1).copy(), n)
    for step in range(n - 1):
        out, into = (r - step - 1) % n, (r - step - 2) % n
        chunks[into] += comm.sendrecv((r + 1) % n, chunks[out], (r - 1) % n, tag="rs")
    return np.concatenate(chunks).reshape(x.shape)


def uses_the_library(comm, x):  # a collective instead of messages
    return comm.allreduce(x)


def index_off_the_end(comm, x):  # forgets % n on a chunk index
    n, r = comm.world_size, comm.rank
    chunks = np.array_split(x.reshape(-1).copy(), n)
    for step in range(n - 1):
        chunks[(r - step - 2) % n] += comm.sendrecv((r + 1) % n, chunks[r + step + 1], (r - 1) % n, tag="rs")
    return np.concatenate(chunks).reshape(x.shape)


def fixed_ring(comm, x):
    """The scaffold as the lesson ships it."""
    ...  # your code here, in place of `...`


def need(engine):
    if not engine_available(engine):
        pytest.skip(f"{engine}: {missing(engine)}")


# --- 09.1 on a real engine ------------------------------------------------------------------------
def test_a_right_ring_agrees_with_mpi():
    need("mpi")
    feedback = check_ring_on_engine(ring, **QUICK)
    assert feedback, feedback
    assert "MPI_Allreduce" in feedback.message and "leaves x unchanged" in feedback.message


def test_the_registered_solution_agrees_with_mpi():
    need("mpi")
    fn = reference("09.1")
    assert fn.__name__ == "fixed_ring"
    feedback = check_ring_on_engine(fn, **QUICK)
    assert feedback, feedback


@pytest.mark.slow
def test_a_right_ring_agrees_with_gloo_on_3_and_5_processes():
    need("gloo")
    feedback = check_ring_on_engine(ring, "gloo", world_sizes=(3, 5), sizes=(10, 100_003))
    assert feedback, feedback
    assert "torch.distributed.all_reduce" in feedback.message and "3 and 5 gloo processes" in feedback.message


def test_reshape_into_n_rows_fails_on_sizes_that_do_not_divide():
    need("mpi")
    feedback = check_ring_on_engine(blog_ring, **QUICK)
    assert not feedback
    assert "10 elements do not divide by 3" in feedback.message and "np.array_split" in feedback.message


@pytest.mark.slow
def test_send_then_recv_deadlocks_on_mpi_for_big_messages():
    need("mpi")
    feedback = check_ring_on_engine(send_then_recv, "mpi", (3,), (100_000,), comm_timeout=2.0, timeout=30)
    assert not feedback
    assert "waited forever" in feedback.message and "comm.sendrecv(right, chunk, left, tag)" in feedback.message


def test_writing_into_x_is_named():
    need("mpi")
    feedback = check_ring_on_engine(in_place, **QUICK)
    assert not feedback
    assert "input x changed" in feedback.message and ".copy()" in feedback.message


def test_a_wrong_result_names_the_rank_and_what_it_holds():
    need("mpi")
    feedback = check_ring_on_engine(reduce_scatter_only, **QUICK)
    assert not feedback
    assert "with 3 mpi processes and x of 10 elements, rank 0's result" in feedback.message
    assert "should hold every rank's exactly once" in feedback.message


# --- 09.1 without the engine: gRPC ranks with synchronous sends, and it says so ---------------------
@pytest.fixture
def no_gloo(monkeypatch):
    monkeypatch.setattr(lesson09, "missing", lambda engine: "torch is not installed (pip install 'allreduce-edu[torch]')")


@pytest.mark.processes
def test_without_the_engine_a_right_ring_passes_and_counts(no_gloo, tmp_path, monkeypatch):
    monkeypatch.setenv("ALLREDUCE_EDU_DATA_DIR", str(tmp_path))
    feedback = check_ring_on_engine(ring, world_sizes=(3,), sizes=(10, 1001))
    assert feedback and feedback.status == "passed", feedback
    assert "gRPC ranks whose sends wait" in feedback.message and "NumPy's sum" in feedback.message
    counted = {ex.id: record.get("status") for ex, record in registry.progress().rows}
    assert counted["09.1"] == "passed"  # counted by progress(), as on gloo


def _diagnosed(feedback) -> bool:
    return (not feedback and feedback.attempted and "waited forever in comm.send" in feedback.message
            and "comm.sendrecv(right, chunk, left, tag)" in feedback.message)


@pytest.mark.processes
def test_without_the_engine_send_then_recv_deadlocks_and_is_diagnosed_every_time(no_gloo):
    """Synchronous sends make the gloo deadlock happen on the package's own ranks: 5 of 5 runs."""
    for run in range(5):
        feedback = check_ring_on_engine(send_then_recv, world_sizes=(3,), sizes=(10,), comm_timeout=1.0)
        assert _diagnosed(feedback), f"run {run + 1}: {feedback}"
        assert "On these ranks, as on gloo," in feedback.message


def isend_wait_then_recv(comm, x):  # the same mistake, written with isend(...).wait()
    n, r = comm.world_size, comm.rank
    chunks = np.array_split(x.reshape(-1).copy(), n)
    for step in range(n - 1):
        comm.isend((r + 1) % n, chunks[(r - step - 1) % n], tag="rs").wait()
        chunks[(r - step - 2) % n] += comm.recv((r - 1) % n, tag="rs")
    return np.concatenate(chunks)


@pytest.mark.processes
def test_without_the_engine_an_isend_waited_before_its_recv_is_diagnosed_as_the_send(no_gloo):
    """The request's wait() raises outside the comm call that made it: still the send's deadlock."""
    feedback = check_ring_on_engine(isend_wait_then_recv, world_sizes=(3,), sizes=(10,),
                                    comm_timeout=1.0)
    assert _diagnosed(feedback), feedback


@pytest.mark.slow
@pytest.mark.processes
def test_on_gloo_send_then_recv_is_diagnosed_every_time():
    """Every rank's send waits; the first to reach its deadline leaves, and the others' gloo then
    says "Connection closed by peer": the diagnosis reads either error, whichever rank it comes from."""
    need("gloo")
    for run in range(5):
        feedback = check_ring_on_engine(send_then_recv, "gloo", world_sizes=(3,), sizes=(10,), comm_timeout=2.0)
        assert _diagnosed(feedback), f"run {run + 1}: {feedback}"
        assert "On gloo," in feedback.message and "threads" not in feedback.message


@pytest.mark.processes
def test_without_the_engine_the_registered_solution_passes(no_gloo):
    feedback = check_ring_on_engine(reference("09.1"), world_sizes=(3,), sizes=(10, 1001))
    assert feedback, feedback
    assert course.passed_or_needs_extra(repr(feedback))


@pytest.mark.processes
@pytest.mark.parametrize("fn, words", [
    (uses_the_library, ["asked for comm.allreduce", "not available"]),
    (index_off_the_end, ["IndexError", "% N"]),
])
def test_errors_in_the_ring_come_with_a_hint(no_gloo, fn, words):
    feedback = check_ring_on_engine(fn, world_sizes=(3,), sizes=(10,))
    assert not feedback and feedback.attempted
    for word in words:
        assert word in feedback.message, feedback


@pytest.mark.processes
def test_without_the_engine_reshape_still_fails_with_the_hint(no_gloo):
    feedback = check_ring_on_engine(blog_ring, world_sizes=(3,), sizes=(10,))
    assert not feedback
    assert "oracle. With 3 gRPC ranks with synchronous sends and x of 10 elements" in feedback.message
    assert "np.array_split" in feedback.message


# --- 09.2 -----------------------------------------------------------------------------------------
def test_torch_names():
    right = {ours: theirs[0] for ours, theirs in TORCH_NAMES.items()}
    assert check_torch_names(right)
    assert check_torch_names({**right, "allreduce": "torch.distributed.all_reduce()", "all_gather": "dist.all_gather"})
    feedback = check_torch_names({**right, "allreduce": "allreduce"})
    assert not feedback and "underscore" in feedback.message
    feedback = check_torch_names({**right, "rank": "rank"})
    assert not feedback and "get_rank()" in feedback.message
    feedback = check_torch_names({**right, "sendrecv": "sendrecv"})
    assert not feedback and "batch_isend_irecv" in feedback.message
    feedback = check_torch_names({k: v for k, v in right.items() if k != "barrier"})
    assert not feedback and "no entry for 'barrier'" in feedback.message
    feedback = check_torch_names({**right, "init": "?", "barrier": "?"})  # some still to fill in
    assert not feedback and feedback.attempted and "2 of the 13 are still" in feedback.message
    assert "'barrier'" in feedback.message
    feedback = check_torch_names({**right, "init": "?", "rank": "rank"})  # a wrong one comes first
    assert not feedback and "get_rank()" in feedback.message
    assert not check_torch_names(["get_rank"]) and "dict" in check_torch_names(["get_rank"]).message


def test_the_names_scaffold_is_not_an_attempt():
    namespace = {}
    exec(NAMES_SCAFFOLD, namespace)  # noqa: S102 - our own scaffold
    assert set(namespace["my_names"]) == set(TORCH_NAMES)
    feedback = check_torch_names(namespace["my_names"])
    assert not feedback and not feedback.attempted and 'hint("09.2")' in feedback.message


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_every_expected_name_exists_in_torch_distributed():
    import torch.distributed as dist
    for theirs in TORCH_NAMES.values():
        for name in theirs:
            obj = dist
            for part in name.split("."):
                obj = getattr(obj, part)  # AttributeError names the missing one
    assert registry.get("09.2").solution.count(":") == len(TORCH_NAMES)


# --- 09.3 and 09.4 --------------------------------------------------------------------------------
def test_hierarchical_prediction():
    ring_s, hier_s = scenario_seconds("ring"), scenario_seconds("hierarchical")
    assert 20e-3 < ring_s < 20.2e-3 and 5.65e-3 < hier_s < 5.75e-3  # the numbers the solution works out
    assert "20.1 ms" in registry.get("09.3").solution and "5.7 ms" in registry.get("09.3").solution
    assert SCENARIO["nodes"] * SCENARIO["ranks_per_node"] == 12
    assert check_hierarchical_prediction(ring_s * 1.01, hier_s * 0.99)
    from allreduce_edu.model.costmodel import predict
    (a_in, b_in), (a_out, b_out), s = SCENARIO["intra"], SCENARIO["inter"], SCENARIO["nbytes"]
    feedback = check_hierarchical_prediction(predict("ring", 12, s, a_in, b_in), hier_s)
    assert not feedback and "inter-node α and β" in feedback.message
    feedback = check_hierarchical_prediction(ring_s, predict("ring", 4, s, a_in, b_in) + predict("ring", 3, s, a_out, b_out))
    assert not feedback and "S/L bytes" in feedback.message
    feedback = check_hierarchical_prediction(ring_s * 1e3, hier_s)
    assert not feedback and "milliseconds" in feedback.message
    assert not check_hierarchical_prediction("fast", hier_s)
    feedback = check_hierarchical_prediction(predict("ring", 3, s / 4, a_out, b_out), hier_s)
    assert not feedback and "off by a factor" in feedback.message and "hierarchical_on_links" in feedback.message
    feedback = check_hierarchical_prediction(ring_s, predict("ring", 3, s / 4, a_out, b_out))
    assert not feedback and "inter-node phase alone" in feedback.message
    feedback = check_hierarchical_prediction(ring_s, predict("ring", 4, s, a_in, b_in) + predict("ring", 12, s / 4, a_out, b_out))
    assert not feedback and "M = N/L ranks" in feedback.message


def test_in_network_answer():
    assert check_in_network_answer("d")
    assert "sends all of S, once" in check_in_network_answer("a").message
    assert "Work it out at N = 2" in check_in_network_answer("B").message
    assert "cheap, not free" in check_in_network_answer("c").message
    assert not check_in_network_answer("e")


def test_the_scaffolds_are_not_attempts():
    for feedback, exercise in ((check_ring_on_engine(fixed_ring), "09.1"),
                               (check_torch_names({"rank": "?"}), "09.2"),
                               (check_hierarchical_prediction(None, None), "09.3"),
                               (check_hierarchical_prediction(0.020, None), "09.3"),  # half an answer
                               (check_in_network_answer("?"), "09.4")):
        assert not feedback and not feedback.attempted, feedback
        assert f'hint("{exercise}")' in feedback.message


def test_every_exercise_is_registered_with_hints():
    for exercise, kind in (("09.1", "code"), ("09.2", "names"), ("09.3", "number"), ("09.4", "choice")):
        ex = registry.get(exercise)
        assert ex.kind == kind and ex.solution and len(ex.hints) >= (2 if kind == "code" else 1)
    assert registry.get("09.4").solution.startswith("d")


@pytest.mark.parametrize("exercise", ["09.2", "09.3", "09.4"])
def test_the_key_cells_pass(exercise):
    *body, last = registry.get(exercise).key.splitlines()
    namespace = {}
    exec("\n".join([*body, f"result = {last}"]), namespace)  # noqa: S102 - our own key
    assert namespace["result"], namespace["result"]
