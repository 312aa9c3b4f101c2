"""Reduce + LayerNorm + Broadcast: every variant against the float64 reference, its bytes and its work."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import cluster_for

import allreduce_edu as ae
from allreduce_edu.bench import fused as fused_bench
from allreduce_edu.collectives.fused import VARIANTS
from allreduce_edu.kernels.reference import layernorm_reference, rmsnorm_reference

# (norm, affine, residual): plain LayerNorm, with gamma/beta, + residual; RMSNorm with gamma, + residual
OPTIONS = [("layernorm", False, False), ("layernorm", True, False), ("layernorm", True, True),
           ("rmsnorm", False, False), ("rmsnorm", True, True)]
TOL = {"float32": 1e-3, "float64": 1e-9}


def partial(rank: int, shape, dtype, seed: int = 0) -> np.ndarray:
    """Rank r's partial activation: different on every rank, with an offset so LayerNorm has a mean to remove."""
    return (np.random.default_rng([seed, rank]).standard_normal(shape) + 0.5).astype(dtype)


def params(hidden: int, dtype, norm: str, affine: bool, residual: bool, shape, seed: int = 0) -> dict:
    """gamma, beta and residual: the same on every rank (derived from the seed, not the rank)."""
    rng = np.random.default_rng([seed, 99])
    kwargs = {"norm": norm}
    if affine:
        kwargs["gamma"] = (rng.random(hidden) + 0.5).astype(dtype)
        if norm == "layernorm":
            kwargs["beta"] = rng.standard_normal(hidden).astype(dtype)
    if residual:
        kwargs["residual"] = rng.standard_normal(shape).astype(dtype)
    return kwargs


def cases(n: int, hiddens=(1, 7, 64), options=OPTIONS):
    """Uneven rows on purpose: none, one, fewer than N (ranks with 0 rows), N + 1, and a prime; float64 for the
    affine + residual options only."""
    rows = sorted({0, 1, max(n - 1, 1), n + 1, 13})
    return (list(itertools.product(rows, hiddens, ["float32"], options))
            + list(itertools.product(rows, hiddens, ["float64"], [o for o in options if o[2]])))


def _run_cases(comm, variant, cases, seed):
    """On every rank: each case once; returns (y, rows normalised) per case, checking x is left alone."""
    out = []
    for rows, hidden, dtype, (norm, affine, residual) in cases:
        x = partial(comm.rank, (rows, hidden), dtype, seed)
        kwargs = params(hidden, dtype, norm, affine, residual, (rows, hidden), seed)
        before = x.copy(), {k: np.copy(v) for k, v in kwargs.items() if k != "norm"}
        stats = {}
        y = ae.reduce_layernorm_broadcast(comm, x, variant=variant, stats=stats, **kwargs)
        assert np.array_equal(x, before[0]), f"rank {comm.rank}: the caller's x was modified"
        assert all(np.array_equal(kwargs[k], v) for k, v in before[1].items()), "gamma/beta/residual modified"
        out.append((y, stats["rows_normalised"]))
    return out


def expected(n: int, rows, hidden, dtype, options, seed) -> np.ndarray:
    """The float64 reference: norm(sum over ranks of x [+ residual]) computed from the float64 sum."""
    norm, affine, residual = options
    kwargs = params(hidden, dtype, norm, affine, residual, (rows, hidden), seed)
    total = sum(partial(r, (rows, hidden), dtype, seed).astype(np.float64) for r in range(n))
    if residual:
        total = total + kwargs["residual"]
    if norm == "rmsnorm":
        return rmsnorm_reference(total, kwargs.get("gamma"), eps=1e-5)
    return layernorm_reference(total, kwargs.get("gamma"), kwargs.get("beta"), eps=1e-5)


def rel_error(y, ref) -> float:
    diff = np.linalg.norm(np.asarray(y, np.float64) - ref)
    return diff / np.linalg.norm(ref) if np.linalg.norm(ref) else diff


def check(cluster, variant, cases, seed=0):
    n = cluster.world_size
    results = cluster.run(_run_cases, variant, cases, seed)  # results[rank][case] = (y, rows normalised)
    for i, (rows, hidden, dtype, options) in enumerate(cases):
        what = f"{variant} N={n} rows={rows} hidden={hidden} {dtype} {options}"
        ys = [results[rank][i][0] for rank in range(n)]
        for rank, y in enumerate(ys):
            assert y.shape == (rows, hidden) and y.dtype == np.dtype(dtype), f"{what}: rank {rank} {y.shape} {y.dtype}"
            assert y.tobytes() == ys[0].tobytes(), f"{what}: rank {rank} differs from rank 0"
        err = rel_error(ys[0], expected(n, rows, hidden, dtype, options, seed))
        assert err < TOL[dtype], f"{what}: relative error {err:.2e}"
        work = [results[rank][i][1] for rank in range(n)]
        assert work == rows_normalised(variant, rows, n), f"{what}: rows normalised per rank {work}"


def rows_normalised(variant: str, rows: int, n: int) -> list[int]:
    """fused: each rank its own rows (np.array_split); unfused: all rows everywhere; root: all rows on rank 0."""
    if variant == "fused":
        return [len(piece) for piece in np.array_split(np.empty(rows), n)]
    return [rows] * n if variant == "unfused" else [rows] + [0] * (n - 1)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_every_variant_matches_the_float64_reference_local(n, variant):
    check(cluster_for("local", n), variant, cases(n))


@pytest.mark.processes
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("n", [1, 3])
def test_every_variant_matches_the_float64_reference_grpc(n, variant):
    check(cluster_for("grpc", n), variant, cases(n, hiddens=(1, 64), options=OPTIONS[1:3] + OPTIONS[4:]))


def _leading_axes(comm, variant):
    x = np.asfortranarray(partial(comm.rank, (2, 3, 8), "float32"))  # (seq, batch, hidden), not C-contiguous
    one_row = partial(comm.rank, (8,), "float32")
    return ae.reduce_layernorm_broadcast(comm, x, variant=variant), ae.reduce_layernorm_broadcast(
        comm, one_row, variant=variant)


@pytest.mark.parametrize("variant", VARIANTS)
def test_leading_axes_are_rows_and_1d_is_one_row(variant):
    cluster = cluster_for("local", 4)
    (y, v), *_ = cluster.run(_leading_axes, variant)
    total = sum(partial(r, (2, 3, 8), np.float64) for r in range(4))
    assert y.shape == (2, 3, 8) and rel_error(y, layernorm_reference(total)) < 1e-3
    one = sum(partial(r, (8,), np.float64) for r in range(4))
    assert v.shape == (8,) and rel_error(v, layernorm_reference(one)) < 1e-3


def _sent(comm, variant, shape):
    x = partial(comm.rank, shape, "float32")
    if variant == "ring all-reduce":
        return ae.allreduce(comm, x, algorithm="ring")
    return ae.reduce_layernorm_broadcast(comm, x, variant=variant)


@pytest.mark.parametrize("transport, n", [("local", 2), ("local", 3), ("local", 4),
                                          pytest.param("grpc", 3, marks=pytest.mark.processes)])
def test_fused_sends_exactly_the_bytes_of_a_ring_allreduce(transport, n):
    cluster = cluster_for(transport, n)
    shape = (4 * n, 24)  # rows divisible by N
    size = 4 * np.prod(shape)  # S in bytes
    cluster.run(_sent, "ring all-reduce", shape)
    ring = cluster.trace.bytes_sent()
    cluster.run(_sent, "fused", shape)
    assert cluster.trace.bytes_sent() == ring == {r: 2 * (n - 1) * size // n for r in range(n)}
    assert {e.collective for e in cluster.trace} == {"reduce_layernorm_broadcast/fused"}


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_root_sends_whole_tensors_and_rank_0_broadcasts_log2_n_times(n):
    cluster = cluster_for("local", n)
    shape = (6, 10)
    size = 4 * 6 * 10
    cluster.run(_sent, "root", shape)
    assert sum(cluster.trace.bytes_sent().values()) == 2 * (n - 1) * size
    from_root = [e for e in cluster.trace if e.src == 0 and e.tag == "broadcast"]
    assert sum(e.nbytes for e in from_root) == (n - 1).bit_length() * size  # ⌈log2 N⌉ · S


def _disagree(comm, what):
    x = np.ones((4, 3), np.float32)
    if what == "variant":
        return ae.reduce_layernorm_broadcast(comm, x, variant="root" if comm.rank == 1 else "fused")
    return ae.reduce_layernorm_broadcast(comm, x if comm.rank else np.ones((5, 3), np.float32))


@pytest.mark.parametrize("what", ["variant", "shape"])
def test_ranks_that_disagree_get_a_collective_mismatch(what):
    with pytest.raises(ae.CollectiveMismatch):
        cluster_for("local", 3).run(_disagree, what)


def _bad(comm, kwargs):
    kwargs = dict(kwargs)
    x = kwargs.pop("x", np.ones((4, 3), np.float32))
    return ae.reduce_layernorm_broadcast(comm, x, **kwargs)


@pytest.mark.parametrize("kwargs, error, words", [
    ({"variant": "magic"}, ValueError, ["'magic'", "fused, unfused, root"]),
    ({"norm": "batchnorm"}, ValueError, ["'batchnorm'", "layernorm, rmsnorm"]),
    ({"x": np.ones((4, 3), np.int32)}, TypeError, ["int32", "float32 or float64"]),
    ({"x": np.float32(1.0)}, ValueError, ["hidden", "()"]),
    ({"x": np.ones((4, 0), np.float32)}, ValueError, ["hidden", "(4, 0)"]),
    ({"gamma": np.ones(4)}, ValueError, ["gamma", "(3,)", "(4,)"]),
    ({"beta": np.ones((3, 1))}, ValueError, ["beta", "(3,)", "(3, 1)"]),
    ({"residual": np.ones((3, 3))}, ValueError, ["residual", "(4, 3)", "(3, 3)"]),
    ({"eps": -1.0}, ValueError, ["eps"]),
    ({"norm": "rmsnorm", "beta": np.ones(3)}, ValueError, ["rmsnorm", "beta"]),
])
def test_bad_arguments_name_the_rank_and_the_problem(kwargs, error, words):
    with pytest.raises(error) as info:
        cluster_for("local", 2).run(_bad, kwargs)
    message = str(info.value)
    assert "reduce_layernorm_broadcast on rank" in message
    assert all(w in message for w in words), message


@pytest.mark.parametrize("iters, warmup, budget, rounds",
                         [(6, 1, 1e9, 6), (6, 1, 0.0, 3), (2, 1, 0.0, 2), (5, 3, 0.0, 3),
                          (4, 3, 1e9, 4), (4, 0, 1e9, 4)])
def test_bench_rounds_stop_at_the_budget_but_not_before_three(iters, warmup, budget, rounds):
    """A budget that no round fits still gets three timed rounds, one that all fit every round
    asked for; every rank stops at the same round (a rank that stopped alone would hang the
    others' next collective)."""
    rows = fused_bench.measure_all(cluster_for("local", 3), rows=(4,), hidden=(8,), iters=iters,
                                   warmup=warmup, budget=budget)
    assert [r["iters"] for r in rows] == [rounds] * 4


def test_bench_rows_have_bytes_work_time_and_errors():
    rows = fused_bench.measure_all(cluster_for("local", 3), rows=(7,), hidden=(16,), iters=2, warmup=1)
    assert [r["variant"] for r in rows] == ["ring all-reduce", "unfused", "root", "fused"]
    size = 7 * 16 * 4
    by = {r["variant"]: r for r in rows}
    assert by["unfused"]["norm_rows_max"] == 7 and by["unfused"]["norm_rows_total"] == 21
    assert by["root"]["norm_rows_max"] == 7 and by["root"]["norm_rows_total"] == 7
    assert by["fused"]["norm_rows_max"] == 3 and by["fused"]["norm_rows_total"] == 7
    assert by["ring all-reduce"]["norm_rows_total"] == 0
    assert by["root"]["sent_total"] == 2 * 2 * size
    for r in rows:
        assert r["wrong"] == 0 and r["max_rel_err"] < 1e-3 and r["time_us"] > 0
        assert r["cpu_us"] is None  # local ranks share one process: no per-rank CPU time
    table = fused_bench.format_table(rows)
    for column in ("rows", "hidden", "variant", "time", "cpu", "sent/rank", "norm rows/rank", "max rel err", "#wrong"):
        assert column in table


def test_cli_bench_op_layernorm_prints_every_table(capsys):
    from allreduce_edu import cli
    code = cli.main(["bench", "--op", "layernorm", "-n", "2", "--transport", "local", "--rows", "5,8",
                     "--hidden", "16", "--iters", "2", "--warmup", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    variant_lines = [line.split() for line in out.splitlines() if line.startswith(" ") and "float32" in line]
    assert [(v[0], v[-1]) for v in variant_lines[:8]] == [(r, "0") for r in ("5", "8") for _ in range(4)]
    for words in ("sent/rank", "norm rows/rank", "max rel err", "#wrong", "add_layernorm", "numpy layernorm",
                  "predicted time / ring all-reduce", "out of bounds values: 0 OK"):
        assert words in out


def test_cli_bench_op_layernorm_fails_when_results_are_wrong(monkeypatch, capsys):
    from allreduce_edu import cli
    monkeypatch.setattr(fused_bench, "layernorm_reference", lambda total, gamma, beta: total)  # a wrong oracle
    assert cli.main(["bench", "--op", "layernorm", "-n", "2", "--transport", "local", "--rows", "4",
                     "--hidden", "8", "--iters", "1", "--warmup", "0"]) == 1
    assert "FAILED" in capsys.readouterr().out


@pytest.mark.parametrize("args", [["--dtype", "int32"], ["--rows", "4,x"], ["--hidden", "0"]])
def test_cli_bench_op_layernorm_rejects_bad_options(args, capsys):
    from allreduce_edu import cli
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "--op", "layernorm", "--transport", "local", *args])
    assert info.value.code == 2


@pytest.mark.processes
def test_bench_on_grpc_ranks_reports_cpu_time_too():
    rows = fused_bench.measure_all(cluster_for("grpc", 3), rows=(5,), hidden=(8,), iters=1, warmup=0)
    assert [r["variant"] for r in rows] == list(fused_bench.ROWS)
    assert all(r["wrong"] == 0 and r["cpu_us"] > 0 and r["cpu_vs_ring"] > 0 for r in rows)
