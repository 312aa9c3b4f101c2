"""NCCL's algorithms on every world size from 1 to 9 on both process transports (issue 26): the double
binary tree and Bruck's all-reduce, reduce-scatter and all-gather give NumPy's answers. The thread
transport sweeps the same sizes in the property tests of test_collectives.py and test_bruck.py."""

from __future__ import annotations

import pytest
from conftest import check_allreduce
from test_bruck import check_halves

import allreduce_edu as ae

pytestmark = pytest.mark.processes


@pytest.mark.parametrize("processes", ["grpc", "shm"])
@pytest.mark.parametrize("n", range(1, 10))
def test_every_world_size_from_one_to_nine(processes, n):
    # a cluster of its own, closed at once: nine sizes of shared clusters would hold ~90 processes
    with ae.Cluster(n, transport=processes, timeout=30.0) as cluster:
        for algorithm in ("double_binary_tree", "bruck"):
            for size, op, dtype in [(0, "sum", "float32"), (n + 1, "max", "int64"),
                                    (1009, "prod", "float64"), (70_001, "sum", "float32")]:
                check_allreduce(cluster, algorithm, op, (size,), dtype, seed=size)
        check_halves(cluster, 2 * n + 1, "min", "int32")
