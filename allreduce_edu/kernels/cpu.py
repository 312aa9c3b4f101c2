"""Numba kernels: the reduction step of every all-reduce, and fused sum + LayerNorm/RMSNorm per
row."""

import os
import threading
import time

# OpenMP's worker threads spin after every parallel kernel by default; on a laptop where rank
# processes share the cores, that spinning steals the CPU gRPC needs (measured: fused 1.25x ring's
# time, 1.04x passive).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numba  # after the OpenMP setting above
import numpy as np  # likewise

from ..ops import NORMS, OPS, check_norm, check_op  # noqa: F401 - NORMS: the kernels' norms, for callers

# elements; below this reduce_into calls NumPy (a parallel launch costs ~2 µs)
NUMBA_MIN_SIZE = 1 << 17
# other dtypes go to NumPy
_NUMBA_DTYPES = tuple(map(np.dtype, ("float32", "float64", "int32", "int64")))
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_LAUNCH_LOCK = threading.Lock()
_JIT = dict(nogil=True, cache=True)
# Sums may be reordered (so LLVM can vectorise them); NaN and Inf keep their IEEE meaning.
_REASSOC = {"reassoc", "contract"}


# ---- reduce_into: acc[i] = op(acc[i], x[i]) on flat, contiguous views ----

@numba.njit(parallel=True, **_JIT)
def _sum_into(acc, x):
    for i in numba.prange(acc.size):
        acc[i] += x[i]


@numba.njit(parallel=True, **_JIT)
def _prod_into(acc, x):
    for i in numba.prange(acc.size):
        acc[i] *= x[i]


@numba.njit(parallel=True, **_JIT)
def _max_into(acc, x):
    for i in numba.prange(acc.size):
        if x[i] > acc[i] or x[i] != x[i]:  # x[i] != x[i] only for NaN: NaN wins, like np.maximum
            acc[i] = x[i]


@numba.njit(parallel=True, **_JIT)
def _min_into(acc, x):
    for i in numba.prange(acc.size):
        if x[i] < acc[i] or x[i] != x[i]:
            acc[i] = x[i]


_REDUCE_KERNELS = {"sum": _sum_into, "prod": _prod_into, "max": _max_into, "min": _min_into}


def _launch(kernel, *args):
    """Run a parallel kernel, one Python thread at a time under Numba's workqueue layer (it aborts
    otherwise)."""
    try:
        # OpenMP and TBB take launches from many threads
        threadsafe = numba.threading_layer() != "workqueue"
    except ValueError:  # no parallel kernel has run yet, so the layer is not chosen yet
        threadsafe = False
    if threadsafe:
        return kernel(*args)
    with _LAUNCH_LOCK:
        return kernel(*args)


def reduce_into(acc, x, op="sum"):
    """acc = op(acc, x) elementwise, in place: the reduction step of every all-reduce algorithm."""
    check_op(op)
    if not isinstance(acc, np.ndarray) or not isinstance(x, np.ndarray):
        raise TypeError(f"acc and x must be NumPy arrays, "
                        f"got {type(acc).__name__} and {type(x).__name__}")
    if acc.shape != x.shape:
        raise ValueError(f"shape mismatch: acc has shape {acc.shape} but x has shape {x.shape}")
    if acc.dtype != x.dtype:
        raise TypeError(f"dtype mismatch: acc is {acc.dtype} but x is {x.dtype}; "
                        "cast one of them first")
    if not acc.flags.c_contiguous or not acc.flags.writeable:
        raise ValueError("acc must be a writeable C-contiguous array "
                         "(reduce_into writes into it in place)")
    if acc.size < NUMBA_MIN_SIZE or acc.dtype not in _NUMBA_DTYPES or np.may_share_memory(acc, x):
        OPS[op](acc, x, out=acc)  # NumPy also handles x overlapping acc
    else:
        _launch(_REDUCE_KERNELS[op], acc.reshape(-1),
                _readonly(np.ascontiguousarray(x).reshape(-1)))
    return acc


# ---- LayerNorm / RMSNorm of a sum of partials, one row at a time ----

@numba.njit(parallel=True, fastmath=_REASSOC, **_JIT)
def _sum_norm_rows(parts, gamma, beta, eps, rms, out):
    """out[r] = norm(sum of parts[p][r]): each input row read once, out[r] written once, stats in
    float64."""
    # parts: tuple of k (rows, hidden) arrays; out: (rows, hidden)
    k, hidden = len(parts), out.shape[1]
    for r in numba.prange(out.shape[0]):
        y = out[r]  # (hidden,): stays in cache for the three passes
        # pass 1: sum the partials; column j is fully read before y[j] is written, so out may be
        # an input
        total = 0.0
        for j in range(hidden):
            v = parts[0][r, j]
            for p in range(1, k):
                v += parts[p][r, j]
            y[j] = v
            total += v
        # pass 2: spread around the mean (two passes, so a large common offset cannot cancel it);
        # RMSNorm measures the spread around 0 instead
        mean = 0.0 if rms else total / hidden
        squares = 0.0
        for j in range(hidden):
            d = y[j] - mean
            squares += d * d
        # pass 3: normalise in place: subtract in float64, then scale in the input dtype
        scale = y.dtype.type(1.0 / np.sqrt(squares / hidden + eps))
        for j in range(hidden):
            y[j] = y.dtype.type(y[j] - mean) * scale * gamma[j] + beta[j]


def _readonly(a):
    """A read-only view, so writeable and read-only inputs (e.g. np.frombuffer) share one compiled
    kernel."""
    view = a.view()
    view.flags.writeable = False
    return view


def _float_rows(name, a):
    """Check a is a float32/float64 array with a last axis and return it as contiguous
    (rows, hidden)."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array, got {type(a).__name__}")
    if a.dtype not in _FLOATS:
        raise TypeError(f"{name} must be float32 or float64, got {a.dtype}; "
                        "cast it with .astype(np.float32)")
    if a.ndim == 0 or a.shape[-1] == 0:
        raise ValueError(f"{name} needs a non-empty last (hidden) axis, got shape {a.shape}")
    return _readonly(np.ascontiguousarray(a).reshape(-1, a.shape[-1]))


def _affine(name, v, fill, hidden, dtype):
    """gamma or beta as a contiguous (hidden,) array of dtype; None means all `fill`."""
    if v is None:
        return np.full(hidden, fill, dtype=dtype)
    v = np.ascontiguousarray(v, dtype=dtype)
    if v.shape != (hidden,):
        raise ValueError(f"{name} must have shape ({hidden},) to match the hidden axis, "
                         f"got {v.shape}")
    return v


def _check_args(eps, norm):
    check_norm(norm)
    if not eps >= 0:
        raise ValueError(f"eps must be a number >= 0, got {eps!r}")


def _check_same(names, inputs) -> None:
    """Every input has the first one's shape and dtype (the error names both)."""
    shape, dtype = inputs[0].shape, inputs[0].dtype
    for n, a in zip(names[1:], inputs[1:], strict=True):
        if a.shape != shape:
            raise ValueError(f"shape mismatch: {names[0]} has shape {shape} "
                             f"but {n} has shape {a.shape}")
        if a.dtype != dtype:
            raise TypeError(f"dtype mismatch: {names[0]} is {dtype} but {n} is {a.dtype}")


def _out_rows(out, shape, dtype):
    """Allocate out, or check the caller's out matches shape and dtype; return it as
    (rows, hidden)."""
    if out is None:
        out = np.empty(shape, dtype=dtype)
    elif not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != dtype:
        got = (out.shape, out.dtype) if isinstance(out, np.ndarray) else type(out).__name__
        raise ValueError(f"out must be an array of shape {shape} and dtype {dtype}, got {got}")
    elif not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be a writeable C-contiguous array")
    return out, out.reshape(-1, shape[-1])


def _sum_norm(inputs, names, gamma, beta, eps, out, norm):
    """norm(sum of same-shape inputs) in one pass; shared by add_layernorm and the norms."""
    _check_args(eps, norm)
    rows = [_float_rows(n, a) for n, a in zip(names, inputs, strict=True)]
    shape, dtype = inputs[0].shape, inputs[0].dtype
    _check_same(names, inputs)
    hidden = shape[-1]
    gamma = _affine("gamma", gamma, 1, hidden, dtype)
    beta = _affine("beta", beta, 0, hidden, dtype)
    out, out2d = _out_rows(out, shape, dtype)
    for n, a in zip(names, rows, strict=True):
        same = a.__array_interface__["data"][0] == out2d.__array_interface__["data"][0]
        if np.may_share_memory(a, out2d) and not same:
            raise ValueError(f"out overlaps {n} without being it: "
                             f"pass out={n} itself, or separate memory")
    _launch(_sum_norm_rows, tuple(rows), gamma, beta, float(eps), norm == "rmsnorm", out2d)
    return out


def layernorm(x, gamma=None, beta=None, eps=1e-5, out=None):
    """LayerNorm over the last axis: (x - mean) / sqrt(var + eps) * gamma + beta, stats in
    float64."""
    return _sum_norm((x,), ("x",), gamma, beta, eps, out, "layernorm")


def rmsnorm(x, gamma=None, eps=1e-6, out=None):
    """RMSNorm over the last axis: x / sqrt(mean(x**2) + eps) * gamma (Zhang & Sennrich, 2019)."""
    return _sum_norm((x,), ("x",), gamma, None, eps, out, "rmsnorm")


def add_layernorm(acc, incoming, gamma=None, beta=None, eps=1e-5, out=None, residual=None,
                  norm="layernorm"):
    """norm(acc + incoming [+ residual]) in one pass: the last step of a fused reduce-scatter."""
    inputs, names = (acc, incoming), ("acc", "incoming")
    if residual is not None:
        inputs, names = inputs + (residual,), names + ("residual",)
    return _sum_norm(inputs, names, gamma, beta, eps, out, norm)


def sum_layernorm(partials, gamma=None, beta=None, eps=1e-5, out=None, norm="layernorm"):
    """norm(sum of k partials) for a (k, ..., hidden) stack or a sequence of k arrays, reading each
    once."""
    if isinstance(partials, np.ndarray) and partials.ndim < 2 or len(partials) == 0:
        raise ValueError(f"partials must hold k >= 1 arrays of the same shape, "
                         f"got {np.shape(partials)}")
    names = tuple(f"partials[{p}]" for p in range(len(partials)))
    return _sum_norm(tuple(partials), names, gamma, beta, eps, out, norm)


def compile_all(dtypes=(np.float32, np.float64)):
    """Compile (or load from cache) every kernel for dtypes; return {kernel: seconds} of first
    calls."""
    seconds = {}

    def first_call(name, fn, *args, **kwargs):
        t0 = time.perf_counter()
        fn(*args, **kwargs)
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t0

    for dtype in map(np.dtype, dtypes):
        x = np.ones((2, 3), dtype=dtype)
        for op, kernel in _REDUCE_KERNELS.items():
            first_call(f"reduce_into[{op}]", _launch, kernel, x.reshape(-1).copy(),
                       _readonly(x.reshape(-1)))
        if dtype in _FLOATS:
            first_call("layernorm", layernorm, x)
            first_call("rmsnorm", rmsnorm, x)
            first_call("add_layernorm", add_layernorm, x, x)
            first_call("add_layernorm[residual]", add_layernorm, x, x, residual=x)
            first_call("sum_layernorm[4 partials]", sum_layernorm, [x] * 4)
    return seconds
