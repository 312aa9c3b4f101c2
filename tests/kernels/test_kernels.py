"""The Numba kernels against the float64 NumPy references, on random and adversarial inputs."""

import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from allreduce_edu.kernels import cpu as kernels
from allreduce_edu.kernels.reference import (
    layernorm_naive_float32,
    layernorm_reference,
    reduce_reference,
    rmsnorm_reference,
)

DTYPES = [np.float32, np.float64, np.int32, np.int64]
FLOATS = [np.float32, np.float64]
TOL = {np.float32: dict(rtol=1e-5, atol=1e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}


def rel_error(y, ref):
    return np.linalg.norm(np.asarray(y, np.float64) - ref) / np.linalg.norm(ref)


def random(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.integer):
        return np.asarray(rng.integers(-1000, 1000, size=shape), dtype)
    return np.asarray(rng.standard_normal(shape), dtype)


@pytest.fixture(params=["numpy", "numba"])
def path(request, monkeypatch):
    """Run reduce_into's tests on both sides of its NumPy/Numba size threshold."""
    monkeypatch.setattr(kernels, "NUMBA_MIN_SIZE", 0 if request.param == "numba" else 1 << 62)
    return request.param


# ---- reduce_into ----

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", kernels.OPS)
@pytest.mark.parametrize("shape", [(0,), (1,), (7,), (3, 5), (2, 0, 4), ()])
def test_reduce_into_matches_numpy(path, op, dtype, shape):
    acc, x = random(shape, dtype, seed=1), random(shape, dtype, seed=2)
    expected = reduce_reference([acc, x], op)
    result = kernels.reduce_into(acc, x, op)
    assert result is acc
    np.testing.assert_array_equal(acc, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", kernels.OPS)
def test_reduce_into_non_contiguous_x(path, op, dtype):
    big = random((6, 10), dtype, seed=3)
    x = big[::2, 1::3]  # (3, 3), strided in both axes
    acc = random(x.shape, dtype, seed=4)
    expected = reduce_reference([acc, x], op)
    kernels.reduce_into(acc, x, op)
    np.testing.assert_array_equal(acc, expected)
    np.testing.assert_array_equal(x, big[::2, 1::3])  # x untouched


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reduce_into_integer_sum_wraps_like_numpy(path, dtype):
    top = np.iinfo(dtype).max
    acc, x = np.array([top, top, -top], dtype), np.array([1, top, -2], dtype)
    with np.errstate(over="ignore"):
        expected = acc + x
    kernels.reduce_into(acc, x, "sum")
    np.testing.assert_array_equal(acc, expected)
    assert acc[0] == np.iinfo(dtype).min


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", kernels.OPS)
def test_reduce_into_nan_propagates(path, op, dtype):
    acc = np.array([1.0, np.nan, 3.0, np.nan, -np.inf], dtype)
    x = np.array([np.nan, 2.0, 3.0, np.nan, 5.0], dtype)
    expected = reduce_reference([acc, x], op)
    kernels.reduce_into(acc, x, op)
    np.testing.assert_array_equal(np.isnan(acc), [True, True, False, True, False])
    np.testing.assert_array_equal(acc, expected)


def test_reduce_into_above_default_threshold():
    n = kernels.NUMBA_MIN_SIZE + 7
    acc, x = random(n, np.float32, seed=5), random(n, np.float32, seed=6)
    expected = acc + x
    kernels.reduce_into(acc, x)
    np.testing.assert_array_equal(acc, expected)


@pytest.mark.parametrize("acc_start, x_start", [(0, 2), (2, 0)])
def test_reduce_into_x_overlapping_acc(path, acc_start, x_start):
    buf = np.arange(12.0)
    acc, x = buf[acc_start:acc_start + 8], buf[x_start:x_start + 8]  # overlapping views of one buffer
    expected = acc + x
    kernels.reduce_into(acc, x)
    np.testing.assert_array_equal(acc, expected)


def test_reduce_into_accepts_read_only_x(path):
    acc = np.arange(4.0)
    x = np.frombuffer(np.arange(4.0).tobytes())  # read-only, as a received message is
    kernels.reduce_into(acc, x)
    np.testing.assert_array_equal(acc, [0.0, 2.0, 4.0, 6.0])


@pytest.mark.parametrize("acc, x, op, error, match", [
    (np.zeros(3), np.zeros(3), "mean", ValueError, "valid ops are sum, prod, max, min"),
    (np.zeros(3), np.zeros(4), "sum", ValueError, r"shape mismatch.*\(3,\).*\(4,\)"),
    (np.zeros(3), np.zeros(3, np.float32), "sum", TypeError, "dtype mismatch.*float64.*float32"),
    (np.zeros((3, 4))[:, ::2], np.zeros((3, 2)), "sum", ValueError, "C-contiguous"),
    ([0.0, 1.0], np.zeros(2), "sum", TypeError, "must be NumPy arrays"),
])
def test_reduce_into_bad_arguments(acc, x, op, error, match):
    with pytest.raises(error, match=match):
        kernels.reduce_into(acc, x, op)


def test_reduce_into_read_only_acc_raises():
    acc = np.frombuffer(bytes(16))
    with pytest.raises(ValueError, match="writeable"):
        kernels.reduce_into(acc, np.zeros(2))


# ---- layernorm and rmsnorm ----

def affine(hidden, dtype, seed=7):
    return random(hidden, dtype, seed) + 1, random(hidden, dtype, seed + 1)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(4, 64), (2, 3, 33), (1, 5), (17,)])
@pytest.mark.parametrize("with_affine", [False, True])
def test_layernorm_matches_reference(dtype, shape, with_affine):
    x = random(shape, dtype) * 3 + 0.5
    gamma, beta = affine(shape[-1], dtype) if with_affine else (None, None)
    y = kernels.layernorm(x, gamma, beta)
    assert y.dtype == dtype and y.shape == shape
    np.testing.assert_allclose(y, layernorm_reference(x, gamma, beta), **TOL[dtype])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("with_gamma", [False, True])
def test_rmsnorm_matches_reference(dtype, with_gamma):
    x = random((5, 48), dtype) + 2
    gamma = affine(48, dtype)[0] if with_gamma else None
    y = kernels.rmsnorm(x, gamma)
    assert y.dtype == dtype
    np.testing.assert_allclose(y, rmsnorm_reference(x, gamma), **TOL[dtype])


def test_large_offset_breaks_naive_float32_but_not_ours():
    rng = np.random.default_rng(8)
    x = (1e3 + rng.standard_normal((8, 1024))).astype(np.float32)  # mean 1000, variance 1
    ref = layernorm_reference(x)
    assert rel_error(layernorm_naive_float32(x), ref) > 0.1
    assert rel_error(kernels.layernorm(x), ref) < 1e-3
    np.testing.assert_allclose(kernels.layernorm(x), ref, atol=1e-4)


@pytest.mark.parametrize("offset", [1e4, -1e4])
def test_layernorm_float32_offset_1e4(offset):
    x = (offset + np.random.default_rng(9).standard_normal((4, 4096))).astype(np.float32)
    y, ref = kernels.layernorm(x), layernorm_reference(x)
    assert rel_error(y, ref) < 1e-3
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-5)  # float64 stats: a float32 mean would be off by ~5e-4
    assert rel_error(kernels.add_layernorm(x, x), layernorm_reference(2.0 * x.astype(np.float64))) < 1e-3


@pytest.mark.parametrize("dtype", FLOATS)
def test_hidden_one_gives_beta(dtype):
    x = random((6, 1), dtype)
    np.testing.assert_array_equal(kernels.layernorm(x), np.zeros((6, 1), dtype))
    beta = np.array([2.5], dtype)
    np.testing.assert_array_equal(kernels.layernorm(x, np.array([3.0], dtype), beta), np.full((6, 1), 2.5, dtype))


@pytest.mark.parametrize("norm", kernels.NORMS)
def test_nan_poisons_only_its_row(norm):
    x = random((3, 16), np.float32)
    x[1, 5] = np.nan
    y = kernels.add_layernorm(x, np.zeros_like(x), norm=norm)
    assert np.isnan(y[1]).all()
    assert np.isfinite(y[[0, 2]]).all()
    ref = layernorm_reference(x[[0, 2]]) if norm == "layernorm" else rmsnorm_reference(x[[0, 2]], eps=1e-5)
    np.testing.assert_allclose(y[[0, 2]], ref, **TOL[np.float32])
    assert np.isnan(kernels.layernorm(x)[1]).all()


def test_zero_rows():
    y = kernels.layernorm(np.zeros((0, 8), np.float32))
    assert y.shape == (0, 8) and y.dtype == np.float32


def test_non_contiguous_and_read_only_inputs():
    big = random((8, 40), np.float64)
    x = big[::2, ::2]  # (4, 20), strided
    np.testing.assert_allclose(kernels.layernorm(x), layernorm_reference(x), **TOL[np.float64])
    frozen = np.frombuffer(x.tobytes()).reshape(x.shape)
    np.testing.assert_allclose(kernels.add_layernorm(x, frozen), layernorm_reference(2 * x), **TOL[np.float64])


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=3, max_side=12),
                  elements=st.floats(-1e3, 1e3)))
def test_layernorm_property(x):
    np.testing.assert_allclose(kernels.layernorm(x), layernorm_reference(x), rtol=1e-9, atol=1e-8)


# ---- fused add + norm ----

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("norm", kernels.NORMS)
@pytest.mark.parametrize("with_affine", [False, True])
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_layernorm_matches_reference(dtype, norm, with_affine, with_residual):
    shape = (3, 5, 40)
    acc, incoming, residual = (random(shape, dtype, seed) for seed in (10, 11, 12))
    gamma, beta = affine(40, dtype) if with_affine else (None, None)
    total = acc.astype(np.float64) + incoming + (residual if with_residual else 0)
    if norm == "layernorm":
        ref = layernorm_reference(total, gamma, beta, eps=1e-5)
        y = kernels.add_layernorm(acc, incoming, gamma, beta, residual=residual if with_residual else None)
    else:
        ref = rmsnorm_reference(total, gamma, eps=1e-5)  # rmsnorm never uses beta
        y = kernels.add_layernorm(acc, incoming, gamma, residual=residual if with_residual else None, norm=norm)
    assert y.dtype == dtype and y.shape == shape
    np.testing.assert_allclose(y, ref, **TOL[dtype])


def test_add_layernorm_refuses_partial_overlap():
    buf = np.zeros((5, 4))
    acc, out = buf[:4], buf[1:]  # out is acc shifted by one row: rows would be overwritten before being read
    with pytest.raises(ValueError, match="out overlaps acc without being it"):
        kernels.add_layernorm(acc, np.ones((4, 4)), out=out)


@pytest.mark.parametrize("alias", ["acc", "incoming"])
def test_add_layernorm_in_place(alias):
    acc, incoming = random((4, 32), np.float64, 13), random((4, 32), np.float64, 14)
    ref = layernorm_reference(acc + incoming)
    target = acc if alias == "acc" else incoming
    y = kernels.add_layernorm(acc, incoming, out=target)
    assert y is target
    np.testing.assert_allclose(target, ref, **TOL[np.float64])


@pytest.mark.parametrize("k", [1, 2, 4, 5])
@pytest.mark.parametrize("dtype", FLOATS)
def test_sum_layernorm_matches_reference(k, dtype):
    partials = random((k, 6, 50), dtype, seed=k)
    gamma, beta = affine(50, dtype)
    ref = layernorm_reference(partials.astype(np.float64).sum(axis=0), gamma, beta)
    np.testing.assert_allclose(kernels.sum_layernorm(partials, gamma, beta), ref, **TOL[dtype])
    out = np.empty((6, 50), dtype)
    assert kernels.sum_layernorm(list(partials), gamma, beta, out=out) is out
    np.testing.assert_allclose(out, ref, **TOL[dtype])
    ref_rms = rmsnorm_reference(partials.astype(np.float64).sum(axis=0), gamma, eps=1e-5)
    np.testing.assert_allclose(kernels.sum_layernorm(partials, gamma, norm="rmsnorm"), ref_rms, **TOL[dtype])


def test_compile_all_reports_every_kernel():
    seconds = kernels.compile_all()
    assert set(seconds) == {*(f"reduce_into[{op}]" for op in kernels.OPS), "layernorm", "rmsnorm",
                            "add_layernorm", "add_layernorm[residual]", "sum_layernorm[4 partials]"}
    assert all(isinstance(s, float) and s >= 0 for s in seconds.values())


# ---- many threads (the in-process transport runs ranks as threads) ----

def test_kernels_from_many_threads():
    x = random((64, 256), np.float32)
    ref = layernorm_reference(x)

    def rank(seed):
        acc = np.zeros(2 * kernels.NUMBA_MIN_SIZE, np.float32)
        kernels.reduce_into(acc, np.full_like(acc, seed))
        return kernels.layernorm(x), acc

    with ThreadPoolExecutor(4) as pool:
        for seed, (y, acc) in enumerate(pool.map(rank, range(12))):
            np.testing.assert_allclose(y, ref, **TOL[np.float32])
            assert (acc == seed).all()


@pytest.mark.processes
def test_workqueue_layer_serialises_launches():
    """Numba's fallback layer aborts the process on concurrent launches unless kernels.py takes turns."""
    code = textwrap.dedent("""
        from concurrent.futures import ThreadPoolExecutor
        import numba, numpy as np
        from allreduce_edu.kernels import cpu as kernels
        x = np.ones((256, 512), np.float32)
        with ThreadPoolExecutor(4) as pool:
            assert all((y == 0).all() for y in pool.map(lambda _: kernels.add_layernorm(x, x), range(40)))
        print(numba.threading_layer())
    """)
    package_root = str(Path(kernels.__file__).resolve().parents[1])
    env = {**os.environ, "NUMBA_THREADING_LAYER": "workqueue",
           "PYTHONPATH": os.pathsep.join([package_root, os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "workqueue"


# ---- kernel_bench (shape of the report only: never time things in unit tests) ----

def test_kernel_bench_rows_and_table():
    from allreduce_edu.bench.kernels import format_kernel_table, kernel_bench

    rows = kernel_bench(rows=8, hidden=16, dtype="float64", partials=3, repeat=1)
    by_name = {r["kernel"]: r for r in rows}
    assert {"numpy copy", "layernorm", "numpy layernorm", "add_layernorm", "sum_layernorm[3]",
            "numpy sum+layernorm[3]", "rmsnorm"} <= set(by_name)
    assert by_name["numpy copy"]["bytes"] == 2 * 8 * 16 * 8 and by_name["numpy copy"]["vs_copy"] == 1.0
    assert by_name["sum_layernorm[3]"]["bytes"] == 4 * 8 * 16 * 8 + 2 * 16 * 8  # 3 partials + out, gamma, beta
    for r in rows:
        assert set(r) == {"kernel", "rows", "hidden", "dtype", "bytes", "time_us", "gbps", "vs_copy"}
        assert r["gbps"] == pytest.approx(r["bytes"] / r["time_us"] / 1e3)
    table = format_kernel_table(rows)
    assert all(r["kernel"] in table for r in rows)
    assert "layernorm is" in table and "faster than numpy layernorm" in table


# ---- bad arguments ----

x32 = np.zeros((2, 4), np.float32)


@pytest.mark.parametrize("call, error, match", [
    (lambda: kernels.add_layernorm(x32, x32, norm="batchnorm"), ValueError, "valid norms are layernorm, rmsnorm"),
    (lambda: kernels.layernorm(np.zeros((2, 4), np.int32)), TypeError, "float32 or float64, got int32"),
    (lambda: kernels.layernorm([[1.0, 2.0]]), TypeError, "must be a NumPy array, got list"),
    (lambda: kernels.layernorm(x32, gamma=np.ones(3)), ValueError, r"gamma must have shape \(4,\).*\(3,\)"),
    (lambda: kernels.layernorm(x32, beta=np.ones((2, 4))), ValueError, r"beta must have shape \(4,\)"),
    (lambda: kernels.layernorm(np.zeros((3, 0), np.float32)), ValueError, "non-empty last"),
    (lambda: kernels.layernorm(np.zeros((), np.float32)), ValueError, "non-empty last"),
    (lambda: kernels.layernorm(x32, eps=-1e-5), ValueError, "eps must be a number >= 0"),
    (lambda: kernels.layernorm(x32, eps=float("nan")), ValueError, "eps must be a number >= 0"),
    (lambda: kernels.layernorm(x32, out=np.empty((2, 4))), ValueError, "out must be an array of shape"),
    (lambda: kernels.layernorm(x32, out=np.empty((4, 2), np.float32).T), ValueError, "C-contiguous"),
    (lambda: kernels.add_layernorm(x32, np.zeros((2, 5), np.float32)), ValueError, "shape mismatch: acc"),
    (lambda: kernels.add_layernorm(x32, np.zeros((2, 4))), TypeError, "dtype mismatch: acc is float32"),
    (lambda: kernels.add_layernorm(x32, x32, residual=np.zeros(4, np.float32)), ValueError, "residual has shape"),
    (lambda: kernels.sum_layernorm([]), ValueError, "k >= 1"),
    (lambda: kernels.sum_layernorm(np.zeros(4, np.float32)), ValueError, "k >= 1"),
])
def test_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()
