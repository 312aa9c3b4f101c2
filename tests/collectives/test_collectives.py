"""The canonical collective tests: each rank contributes data derived from its rank; NumPy is the oracle."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DTYPES, check_allreduce, cluster_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import allreduce_edu as ae
from allreduce_edu.collectives import ALGORITHMS, OPS
from allreduce_edu.comm.window import WindowsUnavailable


def available_on(transport: str) -> list[str]:
    return [a for a in ALGORITHMS
            if transport in ("local", "shm") or ae.collectives.DESCRIPTIONS[a].needs != "windows"]


@st.composite
def cases(draw):
    n = draw(st.integers(1, 9))
    size = draw(st.sampled_from([0, 1, max(n - 1, 0), n + 1, 2, 7, 13, 31, 97]))
    return (n, draw(st.sampled_from(sorted(ALGORITHMS))), draw(st.sampled_from(sorted(OPS))),
            draw(st.sampled_from(DTYPES)), size, draw(st.integers(0, 2**16)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_every_algorithm_op_dtype_and_size_local(case):
    n, algorithm, op, dtype, size, seed = case
    check_allreduce(cluster_for("local", n), algorithm, op, (size,), dtype, seed)


@pytest.mark.parametrize("shape", [(), (3, 5), (2, 0, 3), (4, 1, 7)])
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_any_shape_and_non_contiguous_local(algorithm, shape):
    check_allreduce(cluster_for("local", 5), algorithm, "sum", shape, "float64", strided=True)


@pytest.mark.processes
@pytest.mark.parametrize("n", [1, 3, 4])
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
@pytest.mark.parametrize("processes", ["grpc", "shm"])
def test_process_sweep(processes, algorithm, n):
    """The same cases on both process transports: results identical to NumPy's, so to each other's.
    An algorithm on symmetric windows is refused on gRPC, by name and with the way out."""
    cluster = cluster_for(processes, n)
    if processes == "grpc" and ae.collectives.DESCRIPTIONS[algorithm].needs == "windows" and n > 1:
        with pytest.raises(WindowsUnavailable, match="grpc transport cannot map.*transport='shm'"):
            check_allreduce(cluster, algorithm, "sum", (3,), "float32")
        return
    for size, op, dtype in [(0, "sum", "float32"), (1, "max", "int64"), (n + 1, "prod", "float64"),
                            (1009, "sum", "int32"), (1009, "min", "float32")]:
        check_allreduce(cluster, algorithm, op, (size,), dtype, seed=size)
    check_allreduce(cluster, algorithm, "sum", (3, 4), "float32", strided=True)


@pytest.mark.processes
def test_24_mib_on_grpc_is_streamed_in_chunks():
    cluster = cluster_for("grpc", 3)
    check_allreduce(cluster, "ring", "sum", (6 * 1024 * 1024,), "float32")  # 24 MiB per rank
    assert max(e.nbytes for e in cluster.trace) > 4 * 1024 * 1024  # messages bigger than gRPC's 4 MiB limit


def _every_algorithm_back_to_back(comm):
    out = []
    for algorithm in ae.collectives.available(comm):
        x = np.arange(10, dtype=np.int64) * (comm.rank + 1)
        out.append(ae.allreduce(comm, x, algorithm=algorithm))
    return out


def test_every_algorithm_back_to_back_on_one_cluster(transport):
    cluster = cluster_for(transport, 4)
    expected = np.arange(10) * sum(range(1, 5))
    for per_rank in cluster.run(_every_algorithm_back_to_back):
        for algorithm, y in zip(available_on(transport), per_rank, strict=True):
            np.testing.assert_array_equal(y, expected, err_msg=algorithm)


def _rooted(comm, root):
    x = np.full((2, 3), comm.rank + 1.0)
    return ae.reduce(comm, x, op="sum", root=root), ae.broadcast(comm, x, root=root)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_reduce_and_broadcast_every_root(transport, n):
    if transport != "local" and n not in (1, 3):
        pytest.skip("the process sweep is smaller")
    cluster = cluster_for(transport, n)
    for root in range(n):
        for rank, (reduced, broadcast) in enumerate(cluster.run(_rooted, root)):
            if rank == root:
                np.testing.assert_array_equal(reduced, np.full((2, 3), n * (n + 1) / 2))
            else:
                assert reduced is None
            np.testing.assert_array_equal(broadcast, np.full((2, 3), root + 1.0))


def _scatter_gather(comm, rows):
    x = np.arange(rows * 3, dtype=np.float64).reshape(rows, 3) + comm.rank
    mine = ae.reduce_scatter(comm, x, op="sum")
    varying = np.full((comm.rank + 1, 2), comm.rank, dtype=np.int32)  # ranks contribute different lengths
    return mine, ae.all_gather(comm, mine), ae.all_gather(comm, varying)


@pytest.mark.parametrize("rows", [0, 2, 4, 7])
def test_reduce_scatter_and_all_gather(transport, rows):
    n = 4
    cluster = cluster_for(transport, n)
    full = sum(np.arange(rows * 3, dtype=np.float64).reshape(rows, 3) + r for r in range(n))
    pieces = np.array_split(full, n, axis=0)
    for rank, (mine, gathered, varying) in enumerate(cluster.run(_scatter_gather, rows)):
        np.testing.assert_array_equal(mine, pieces[rank])
        np.testing.assert_array_equal(gathered, full)
        np.testing.assert_array_equal(varying, np.concatenate([np.full((r + 1, 2), r) for r in range(n)]))


def _bad_call(comm, kind):
    x = np.ones(4, np.float32)
    if kind == "algorithm":
        ae.allreduce(comm, x, algorithm="butterfly")
    elif kind == "op":
        ae.allreduce(comm, x, op="mean")
    elif kind == "root":
        ae.reduce(comm, x, root=comm.world_size)
    elif kind == "dtype":
        ae.allreduce(comm, np.array(["a", "b"]))
    elif kind == "object":
        ae.allreduce(comm, np.array([1, None], dtype=object))


@pytest.mark.parametrize("kind, error, words", [
    ("algorithm", ValueError, ["'butterfly'", "ring", "tree", "rabenseifner"]),
    ("op", ValueError, ["'mean'", "sum", "prod", "max", "min"]),
    ("root", ValueError, ["root=4", "0..3"]),
    ("dtype", TypeError, ["<U1", "float32"]),
    ("object", TypeError, ["object", "float32"]),
])
def test_bad_arguments_fail_before_any_message(transport, kind, error, words):
    cluster = cluster_for(transport, 4)
    with pytest.raises(error) as info:
        cluster.run(_bad_call, kind)
    assert all(w in str(info.value) for w in words + ["rank "]), str(info.value)
    assert len(cluster.trace) == 0, "nothing may be sent before the arguments are checked"


def _disagree(comm, what):
    x = np.ones(4, np.float32)
    if what == "op":
        return ae.allreduce(comm, x, op="max" if comm.rank == 2 else "sum")
    return ae.allreduce(comm, x, algorithm="tree" if comm.rank == 2 else "ring")


@pytest.mark.parametrize("what, words", [("op", ["op='max'", "op='sum'"]),
                                         ("algorithm", ["algorithm='tree'", "algorithm='ring'"])])
def test_ranks_disagreeing_on_op_or_algorithm_raise_mismatch(transport, what, words):
    with pytest.raises(ae.CollectiveMismatch) as info:
        cluster_for(transport, 4).run(_disagree, what)
    assert "rank 2 called" in str(info.value) and all(w in str(info.value) for w in words), str(info.value)
    assert 2 in info.value.ranks


def test_world_size_below_one_is_refused():
    with pytest.raises(ValueError, match="world_size must be an integer >= 1, got 0"):
        ae.Cluster(0)


def _lists(comm):
    return ae.allreduce(comm, [1, 2, 3])  # converted as np.asarray would: int64


def test_lists_convert_like_numpy():
    (y, *_) = cluster_for("local", 3).run(_lists)
    assert y.dtype == np.asarray([1, 2, 3]).dtype and y.tolist() == [3, 6, 9]


def _nan_inf(comm, algorithm):
    x = np.array([np.nan if comm.rank == 1 else 1.0, np.inf, -np.inf if comm.rank == 0 else 1.0])
    return ae.allreduce(comm, x, algorithm=algorithm), ae.allreduce(comm, x, op="max", algorithm=algorithm)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_nan_and_inf_propagate_as_numpy(algorithm):
    total, biggest = cluster_for("local", 3).run(_nan_inf, algorithm)[0]
    np.testing.assert_array_equal(total, [np.nan, np.inf, -np.inf])
    np.testing.assert_array_equal(biggest, [np.nan, np.inf, 1.0])
