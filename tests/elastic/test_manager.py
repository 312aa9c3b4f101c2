"""The Lighthouse and the Manager in one process: real gRPC, replicas as threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from allreduce_edu.comm.errors import RankFailure
from allreduce_edu.training.elastic import Lighthouse, LighthouseClient, Manager, state_digest


def test_the_lighthouse_refuses_a_caller_without_its_token():
    with Lighthouse() as lighthouse:
        client = LighthouseClient(lighthouse.address, "not-the-token", "intruder")
        with pytest.raises(RankFailure, match="UNAUTHENTICATED"):
            client.call("Heartbeat", 2.0)
        client.close()


def _replica(lighthouse, i, steps, start, log, algorithm="ring", fail_at=None):
    """Train w <- w - 0.1·mean(grad), grad = i + 1, from step `start`."""
    state = [np.full(6, 5.0 if start == 0 else 1.0)]  # a replica at step 0 is elsewhere
    failed = []
    manager = Manager(f"r{i}", lighthouse.address, lighthouse.token, lambda: state,
                      lambda arrays: state.__setitem__(0, arrays[0]), step=start,
                      algorithm=algorithm, timeout=5.0)
    try:
        while manager.step < steps:
            manager.start_quorum()
            avg = manager.allreduce(np.full(6, i + 1.0))
            if manager.step == fail_at and i == 1 and not failed:
                failed.append(manager.step)
                manager.errors.append(RuntimeError("this replica's step went wrong"))
            ok = manager.should_commit()
            if ok:
                state[0] = state[0] - 0.1 * avg
            log.append((f"r{i}", manager.step, ok, manager.quorum_id, manager.healing,
                        state_digest(state).tobytes()))
    finally:
        manager.close()


def _train(lighthouse, starts, steps, **kwargs):
    log = []
    threads = [threading.Thread(target=_replica, args=(lighthouse, i, steps, s, log), kwargs=kwargs)
               for i, s in enumerate(starts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return log


def test_a_replica_behind_heals_from_a_peer_and_then_trains_in_step():
    with Lighthouse(min_replicas=3, heartbeat_timeout=1.0) as lighthouse:
        log = _train(lighthouse, starts=[0, 4, 4], steps=8)
    first = [e for e in log if e[0] == "r0"][0]
    assert first[1] == 5 and first[2] and first[4], "r0 should heal to step 4 and commit step 5"
    by_step = {}
    for _, step, ok, *_, digest in log:
        if ok:
            by_step.setdefault(step, set()).add(digest)
    assert sorted(by_step) == [5, 6, 7, 8]
    assert all(len(d) == 1 for d in by_step.values()), "replicas at one step differ"


def test_a_learners_allreduce_and_a_vetoed_step():
    def my_sum(comm, x):  # a learner's fn(comm, x): everyone sends to everyone
        total = x.copy()
        for peer in range(comm.world_size):
            if peer != comm.rank:
                comm.send(peer, x, "mine")
        for peer in range(comm.world_size):
            if peer != comm.rank:
                total += comm.recv(peer, "mine")
        return total

    with Lighthouse(min_replicas=2, heartbeat_timeout=1.0) as lighthouse:
        log = _train(lighthouse, starts=[3, 3], steps=6, algorithm=my_sum, fail_at=4)
    vetoed = [e for e in log if not e[2]]
    assert [e[:2] for e in sorted(vetoed)] == [("r0", 4), ("r1", 4)], "one error vetoes both"
    after = [e for e in log if e[2] and e[1] == 5]
    assert len({e[3] for e in after}) == 1 and after[0][3] > vetoed[0][3], "a fresh world after"
    assert len({e[5] for e in log if e[1] == 6}) == 1, "both hold the same weights at the end"


def test_a_replica_whose_lighthouse_is_gone_backs_off_instead_of_spinning(monkeypatch):
    from allreduce_edu.training.elastic import manager as module

    waits = []
    monkeypatch.setattr(module, "back_off", waits.append)  # what it would wait, not waited
    with Lighthouse(min_replicas=1) as lighthouse:
        manager = Manager("r0", lighthouse.address, lighthouse.token, lambda: [np.zeros(2)],
                          lambda arrays: None, timeout=2.0, quorum_timeout=2.0)
    try:  # the Lighthouse has closed: every quorum call fails, and each waits longer first
        for _ in range(8):
            manager.start_quorum()
            manager.allreduce(np.ones(2))
            assert not manager.should_commit()
        assert manager.lighthouse_failures == 8
        assert waits == [module.BACKOFF_FIRST * 2 ** k for k in range(6)] + [module.BACKOFF_MOST]
    finally:
        manager.close()
