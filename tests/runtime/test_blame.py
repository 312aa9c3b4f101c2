"""The rank named when a collective times out is the rank that did not take part, on every run:
each wait says whom it waited for (CollectiveError.waiting_for), and the Cluster follows the waits
to the rank that returned while the others waited (runtime/failures.py's `absent`)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import allreduce_edu as ae
from allreduce_edu.comm.errors import CollectiveAborted, CollectiveTimeout
from allreduce_edu.runtime.failures import absent
from allreduce_edu.runtime.worker import Report


def _all_but(comm, missing: int, algorithm: str):
    if comm.rank != missing:
        ae.allreduce(comm, np.ones(1000), algorithm=algorithm)
    return comm.rank


@pytest.mark.parametrize("transport", ["local", pytest.param("shm", marks=pytest.mark.processes),
                                       pytest.param("grpc", marks=pytest.mark.processes)])
def test_the_rank_that_never_called_the_collective_is_named_in_every_run(transport):
    named = []
    with ae.Cluster(4, transport, timeout=1.5) as cluster:  # its own: a short deadline
        for run, (missing, algorithm) in enumerate([(2, "ring"), (0, "ring"), (3, "tree"),
                                                    (1, "naive"), (2, "recursive_doubling")]):
            with pytest.raises(CollectiveTimeout) as raised:
                cluster.run(_all_but, missing, algorithm)
            named.append((missing, raised.value.failed_rank))
            said = str(raised.value)
            assert f"rank {missing} returned from cluster.run(_all_but)" in said, run
            assert f"waited for it in allreduce(algorithm='{algorithm}', op='sum'" in said, said
    assert all(missing == rank for missing, rank in named), named


def _timeout(rank: int, waiting_for: int) -> Report:
    return Report(rank, 1, kind="error", error=CollectiveTimeout("t", waiting_for=waiting_for))


def test_a_timeout_keeps_the_call_it_waited_in_between_processes():
    sent = CollectiveTimeout("t", ranks=(1,), waiting_for=1, call="allreduce(op=sum)")
    got = pickle.loads(pickle.dumps(sent))
    assert (got.ranks, got.waiting_for, got.call) == ((1,), 1, "allreduce(op=sum)")


def test_the_waits_are_followed_to_the_end_and_a_cycle_names_no_one():
    aborted = Report(3, 1, kind="error", error=CollectiveAborted("a", waiting_for=2))
    assert absent([_timeout(0, 3), _timeout(1, 0), aborted], finished=[2]) == (2, [0, 1, 3])
    assert absent([_timeout(0, 1), _timeout(1, 0)], finished=[2]) is None  # a deadlock: no one
    assert absent([_timeout(0, 3)], finished=[]) is None  # rank 3 is not known to have returned
