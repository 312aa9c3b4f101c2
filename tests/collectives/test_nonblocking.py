"""Non-blocking collectives: the same results as the blocking ones, in issue order, with deadlines;
a rank killed while a request is in flight fails wait() on every survivor."""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest
from conftest import cluster_for

import allreduce_edu as ae
from allreduce_edu.collectives.nonblocking import wait_all
from allreduce_edu.runtime.osfacts import die_now


def _mixed(comm):
    requests = [ae.iallreduce(comm, np.full(1000, comm.rank + i, np.float32), algorithm=a)
                for i, a in enumerate(["ring", "tree", "recursive_doubling", "naive"])]
    shard = ae.ireduce_scatter(comm, np.arange(8.0))
    gathered = ae.iall_gather(comm, np.array([comm.rank]))
    x = np.ones(3)
    blocking = ae.allreduce(comm, x)  # waits for the requests before it starts
    done_before = all(r.done() for r in requests + [shard, gathered])
    return ([r.wait()[0] for r in requests], shard.wait().tolist(), gathered.wait().tolist(),
            blocking.tolist(), done_before)


def test_requests_give_the_blocking_results_in_issue_order(transport):
    for rank, (sums, shard, gathered, blocking, done_before) in enumerate(cluster_for(transport, 4).run(_mixed)):
        assert sums == [6 + 4 * i for i in range(4)]
        assert shard == (np.array_split(np.arange(8.0) * 4, 4)[rank]).tolist()
        assert gathered == [0, 1, 2, 3] and blocking == [4.0, 4.0, 4.0] and done_before


def _input_copied(comm):
    x = np.ones(4)
    request = ae.iallreduce(comm, x)
    x[:] = 100  # changing the input after issuing does not change the result
    return request.wait().tolist(), repr(request)


def test_the_input_is_copied_when_the_request_is_issued():
    for result, text in cluster_for("local", 3).run(_input_copied):
        assert result == [3.0] * 4 and text.startswith("CollectiveRequest(allreduce/ring, 32 bytes, done")


def _mismatch(comm):
    request = ae.iallreduce(comm, np.ones(4 if comm.rank else 5))
    try:
        request.wait()
    except ae.CollectiveError as e:  # the mismatch, or the wait on a rank that saw it
        return type(e).__name__, str(e)
    return "no error", ""


def test_a_mismatch_inside_a_request_is_raised_by_wait():
    with ae.Cluster(3, transport="local", timeout=1) as cluster:  # a rank that never sees it times out
        results = cluster.run(_mismatch)
    assert any(kind == "CollectiveMismatch" and "shape" in text for kind, text in results)
    assert all(kind in ("CollectiveMismatch", "CollectiveTimeout") for kind, _ in results)


def _outcome_of_a_request_whose_peer_dies(comm, folder):
    if comm.rank == 1:
        time.sleep(0.5)
        die_now()
    request = ae.iallreduce(comm, np.ones(1 << 16))
    t0 = time.monotonic()
    try:
        request.wait()
        outcome = {"error": None}
    except ae.RankFailure as e:
        outcome = {"error": type(e).__name__, "ranks": list(e.ranks), "message": str(e)}
    outcome["seconds"] = time.monotonic() - t0
    with open(os.path.join(folder, f"rank{comm.rank}.json"), "w") as f:
        json.dump(outcome, f)


@pytest.mark.processes
def test_a_rank_killed_while_a_request_is_in_flight_fails_wait_on_every_survivor(tmp_path):
    with ae.Cluster(4, timeout=20) as cluster, pytest.raises(ae.RankFailure, match="rank 1 died"):
        cluster.run(_outcome_of_a_request_whose_peer_dies, str(tmp_path))
    outcomes = {int(p.stem[4:]): json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")}
    assert sorted(outcomes) == [0, 2, 3]
    for rank, outcome in outcomes.items():
        assert outcome["error"] == "RankFailure", (rank, outcome)
        assert outcome["seconds"] < 10, "a survivor sat out its 20 s deadline"


def _times_out(comm):
    if comm.rank == 0:
        request = ae.iallreduce(comm, np.ones(2))  # the others never join
        with pytest.raises(ae.CollectiveTimeout, match="not finished within 0.2 s"):
            request.wait(timeout=0.2)
        with pytest.raises(ae.CollectiveTimeout):
            request.wait()  # the message's own deadline ends it
    return True


def test_wait_has_a_deadline_and_the_collective_its_own():
    with ae.Cluster(2, transport="local", timeout=1) as cluster:
        assert cluster.run(_times_out) == [True, True]


def test_wait_all_raises_the_first_error_after_every_request_finished():
    class Done:
        def __init__(self, value, error=None):
            self.value, self.error = value, error

        def wait(self):
            if self.error:
                raise self.error
            return self.value
    assert wait_all([Done(1), Done(2)]) == [1, 2]
    with pytest.raises(ValueError, match="first"):
        wait_all([Done(1), Done(None, ValueError("first")), Done(None, KeyError("second"))])


def _issues_then_raises(comm):
    ae.iallreduce(comm, np.ones(1000))
    ae.iallreduce(comm, np.ones(1000))
    raise ValueError("the learner's bug")


def test_requests_of_a_failed_run_finish_before_the_next_run_and_threads_end_with_the_cluster():
    with ae.Cluster(3, transport="local") as cluster:
        with pytest.raises(ValueError, match="the learner's bug"):
            cluster.run(_issues_then_raises)
        results = cluster.run(lambda comm: ae.allreduce(comm, np.arange(4.0)).tolist())
        assert results == [[0.0, 3.0, 6.0, 9.0]] * 3  # nothing stale from the failed run
        threads = [comm.progress().thread for comm in cluster._world.world.comms]
        assert all(t.is_alive() for t in threads)
    assert not any(t.is_alive() for t in threads)  # closing the cluster ended them


def _p2p_while_iallreduce(comm, rounds):
    """The program MPI allows: a collective in flight on the communication thread, point-to-point
    on the main thread meanwhile (issue 25)."""
    n, r = comm.world_size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    results = []
    for i in range(rounds):
        x = np.arange(4.0) + r + i
        req = ae.iallreduce(comm, x)
        got = comm.sendrecv(right, np.array([r, i]), left, tag="p2p")
        results.append((req.wait().tolist(), got.tolist()))
    return results


def test_point_to_point_during_an_iallreduce_keeps_its_own_state(transport):
    n, rounds = 4, 5
    results = cluster_for(transport, n).run(_p2p_while_iallreduce, rounds)
    for r, per_round in enumerate(results):
        for i, (reduced, got) in enumerate(per_round):
            assert reduced == (sum(np.arange(4.0) + q + i for q in range(n))).tolist()
            assert got == [(r - 1) % n, i]  # the left neighbour's message of this round


def _late_p2p_during_a_collective(comm):
    req = ae.iallreduce(comm, np.ones(3))
    try:
        if comm.rank == 0:
            comm.recv(1, "never-sent", timeout=0.5)  # plain: fails on its own, naming no collective
    finally:
        req.wait()


def test_a_failing_plain_recv_names_no_collective_it_was_not_part_of(transport):
    with pytest.raises(ae.CollectiveTimeout) as raised:
        cluster_for(transport, 2).run(_late_p2p_during_a_collective)
    text = str(raised.value)
    assert "(plain recv)" in text and "allreduce" not in text


@pytest.mark.parametrize("how", ["unknown algorithm", "ranks disagree"])
def test_a_failure_nobody_waited_for_fails_the_run_and_the_cluster_still_works(transport, how):
    def never_waited(comm):
        if how == "unknown algorithm":
            ae.iallreduce(comm, np.ones(3), algorithm="nope")
        else:
            ae.iallreduce(comm, np.ones(3), op="max" if comm.rank == 0 else "sum")
        return "the run returned"

    cluster = cluster_for(transport, 4)
    words = "unknown algorithm 'nope'" if how == "unknown algorithm" else "rank 0 called allreduce"
    with pytest.raises((ValueError, ae.CollectiveMismatch), match=words) as raised:
        cluster.run(never_waited)
    if transport == "local" and hasattr(raised.value, "add_note"):  # 3.11+: the rank's own error
        assert any("nobody waited for" in note for note in raised.value.__notes__)
    assert cluster.run(lambda comm: ae.allreduce(comm, np.ones(2)).tolist())[0] == [4.0, 4.0]


def test_a_failure_nobody_waited_for_is_raised_by_the_next_call_and_only_once():
    def next_call(comm):
        ae.iallreduce(comm, np.ones(3), algorithm="nope")
        try:
            ae.allreduce(comm, np.ones(2))  # the next call hears of it
        except ValueError as e:
            heard = str(e)
        return heard, ae.allreduce(comm, np.ones(2)).tolist()  # once heard, never again

    for heard, after in cluster_for("local", 2).run(next_call):
        assert "unknown algorithm 'nope'" in heard and after == [2.0, 2.0]


def test_a_failure_that_was_waited_for_is_not_raised_again():
    def waited(comm):
        request = ae.iallreduce(comm, np.ones(3), algorithm="nope")
        with pytest.raises(ValueError):
            request.wait()
        return ae.allreduce(comm, np.ones(1)).tolist()

    assert cluster_for("local", 2).run(waited) == [[2.0], [2.0]]
