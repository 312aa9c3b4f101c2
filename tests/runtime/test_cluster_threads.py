"""A Cluster shared between threads (a notebook's widget callback beside a cell; issue 37's first
case): concurrent `run` calls take turns, and each caller gets its own results."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from conftest import cluster_for

import allreduce_edu as ae


def _sum_of(comm, value):
    return float(ae.allreduce(comm, np.full(4, value * (comm.rank + 1), np.float64))[0])


@pytest.mark.parametrize("transport", ["local", pytest.param("grpc", marks=pytest.mark.processes)])
def test_two_threads_running_on_one_cluster_each_get_their_own_results(transport):
    cluster = cluster_for(transport, 4)
    results, errors = {}, []

    def caller(value):
        try:
            for _ in range(5):
                got = cluster.run(_sum_of, value)
                results.setdefault(value, []).append(got)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=caller, args=(v,)) for v in (1.0, 10.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a run hung"
    assert not errors, errors
    for value in (1.0, 10.0):  # 1 + 2 + 3 + 4 = 10 times the caller's own value, on every rank
        assert results[value] == [[10 * value] * 4] * 5
