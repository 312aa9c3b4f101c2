"""LayerNorm / RMSNorm of a sum of partials as CUDA kernels: one block per row, the row's statistics
by a tree reduction across the block's threads (block.py). Introduced in lessons/14_gpu_kernels.

The same names, arguments and float64 statistics as the CPU kernels in `allreduce_edu.kernels.cpu`.
NumPy arrays are copied to the GPU and the result back; device arrays (`cuda.to_device`, or torch
tensors through `cuda.as_cuda_array`) stay on the GPU, and so does the result.
"""

from __future__ import annotations

import math

import numpy as np
from numba import float64

from ..cpu import _affine, _check_args, _check_same, _float_rows, _out_rows  # the CPU checks
from .block import MAX_THREADS, block_sum, threads_for
from .target import cuda


@cuda.jit
def _norm_rows(a, b, c, k, gamma, beta, eps, rms, out):
    """Block r: out[r] = norm(a[r] + b[r] + c[r]), the first k of them; stats in float64."""
    # a, b, c, out: (rows, hidden); thread t owns columns t, t + threads, t + 2·threads, ...
    r, t, threads = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x
    hidden = out.shape[1]
    shared = cuda.shared.array(MAX_THREADS, float64)  # block_sum's wire: one slot per thread
    # pass 1: sum the partials; neighbouring threads read neighbouring columns (coalesced), and
    # column j is read before out[r, j] is written, so out may be an input
    total = np.float64(0.0)  # float64 also in the simulator, where NumPy would keep float32
    for j in range(t, hidden, threads):
        v = a[r, j]
        if k > 1:
            v += b[r, j]
        if k > 2:
            v += c[r, j]
        out[r, j] = v
        total += v
    # the row's mean: the block's tree reduction of the threads' totals (RMSNorm: 0)
    mean = np.float64(0.0) if rms else block_sum(total, shared) / hidden
    # pass 2: spread around the mean, two passes as on the CPU (no cancellation at large offsets)
    squares = np.float64(0.0)
    for j in range(t, hidden, threads):
        d = out[r, j] - mean
        squares += d * d
    scale = 1.0 / math.sqrt(block_sum(squares, shared) / hidden + eps)
    # pass 3: normalise in place, in float64, stored in the row's dtype
    for j in range(t, hidden, threads):
        out[r, j] = (out[r, j] - mean) * scale * gamma[j] + beta[j]


def _is_device(a) -> bool:
    return cuda.devicearray.is_cuda_ndarray(a)


def _device_affine(name, v, hidden: int, dtype):
    """A gamma or beta already on the device: one value per column, the inputs' dtype."""
    if tuple(v.shape) != (hidden,) or v.dtype != dtype:
        raise ValueError(f"{name} must have shape ({hidden},) and dtype {dtype}, "
                         f"got {tuple(v.shape)} {v.dtype}")
    return v


def _device_rows(name, a):
    """A device array (or a NumPy one, copied over) as (rows, hidden), checked like a NumPy
    input."""
    if not _is_device(a):
        return cuda.to_device(_float_rows(name, a))
    if a.dtype not in (np.float32, np.float64):
        raise TypeError(f"{name} must be float32 or float64, got {a.dtype}")
    hidden = a.shape[a.ndim - 1] if a.ndim else 0  # (a.shape[-1]: the simulator's shapes lack it)
    if hidden == 0 or not a.is_c_contiguous():
        raise ValueError(f"{name} must be C-contiguous with a non-empty last axis, got {a.shape}")
    return a.reshape(a.size // hidden, hidden)


def _sum_norm(inputs, names, gamma, beta, eps, out, norm, threads):
    """norm(sum of 1 to 3 same-shape inputs), one block per row; on the device if any input is."""
    _check_args(eps, norm)
    on_device = any(_is_device(a) for a in inputs)
    rows = [(_device_rows if on_device else _float_rows)(n, a)
            for n, a in zip(names, inputs, strict=True)]
    shape, dtype = inputs[0].shape, inputs[0].dtype
    _check_same(names, inputs)
    hidden = shape[len(shape) - 1]
    gamma, beta = (_device_affine(name, v, hidden, dtype) if _is_device(v)
                   else _affine(name, v, fill, hidden, dtype)
                   for name, v, fill in (("gamma", gamma, 1), ("beta", beta, 0)))
    if on_device:
        result = cuda.device_array(shape, dtype) if out is None else out
        if tuple(result.shape) != tuple(shape) or result.dtype != dtype:
            raise ValueError(f"out must be an array of shape {shape} and dtype {dtype}, "
                             f"got {(result.shape, result.dtype)}")
        out2d = _device_rows("out", result)
    else:
        result, out2d = _out_rows(out, shape, dtype)
        if out2d.shape[0] == 0:
            return result
        rows = [cuda.to_device(a) for a in rows]  # host → device, once per input
    threads = threads_for(hidden) if threads is None else threads
    if threads < 1 or threads & (threads - 1) or threads > MAX_THREADS:
        raise ValueError(f"threads must be a power of two from 1 to {MAX_THREADS} (the block's "
                         f"tree halves it every step), got {threads}")
    device_out = out2d if on_device else cuda.device_array(out2d.shape, dtype)
    a, b, c = (rows + rows[:1] * 2)[:3]  # unused inputs: any array of the right type
    if out2d.shape[0] > 0:  # one block per row
        _norm_rows[out2d.shape[0], threads](a, b, c, len(rows), cuda.to_device(gamma),
                                            cuda.to_device(beta), float(eps),
                                            norm == "rmsnorm", device_out)
    if not on_device:
        device_out.copy_to_host(out2d)  # device → host
    return result


def layernorm(x, gamma=None, beta=None, eps=1e-5, out=None, threads=None):
    """LayerNorm over the last axis on the GPU: (x - mean) / sqrt(var + eps) * gamma + beta."""
    return _sum_norm((x,), ("x",), gamma, beta, eps, out, "layernorm", threads)


def rmsnorm(x, gamma=None, eps=1e-6, out=None, threads=None):
    """RMSNorm over the last axis on the GPU: x / sqrt(mean(x**2) + eps) * gamma."""
    return _sum_norm((x,), ("x",), gamma, None, eps, out, "rmsnorm", threads)


def add_layernorm(acc, incoming, gamma=None, beta=None, eps=1e-5, out=None, residual=None,
                  norm="layernorm", threads=None):
    """norm(acc + incoming [+ residual]) in one kernel: the fused reduce-scatter's last step."""
    inputs, names = (acc, incoming), ("acc", "incoming")
    if residual is not None:
        inputs, names = inputs + (residual,), names + ("residual",)
    return _sum_norm(inputs, names, gamma, beta, eps, out, norm, threads)
