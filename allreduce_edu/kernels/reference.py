"""Plain NumPy float64 references that the Numba kernels in kernels.py are tested against."""

import numpy as np

from ..ops import OPS, check_op


def reduce_reference(arrays, op="sum"):
    """Elementwise op over a sequence of same-shape arrays, folded left to right in their own
    dtype."""
    return OPS[check_op(op)].reduce(np.stack(arrays), axis=0)


def _affine(y, gamma, beta):
    """y * gamma + beta, where None means no scale or no shift."""
    if gamma is not None:
        y = y * np.asarray(gamma, dtype=np.float64)
    if beta is not None:
        y = y + np.asarray(beta, dtype=np.float64)
    return y


def layernorm_reference(x, gamma=None, beta=None, eps=1e-5):
    """LayerNorm over the last axis in float64, two-pass: mean, then mean squared deviation
    (Ba et al., 2016)."""
    x = np.asarray(x, dtype=np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return _affine((x - mean) / np.sqrt(var + eps), gamma, beta)


def rmsnorm_reference(x, gamma=None, eps=1e-6):
    """RMSNorm over the last axis in float64: x / sqrt(mean(x**2) + eps) * gamma
    (Zhang & Sennrich, 2019)."""
    x = np.asarray(x, dtype=np.float64)
    return _affine(x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + eps), gamma, None)


def layernorm_naive_float32(x, gamma=None, beta=None, eps=1e-5):
    """The classic bug: one pass, var = E[x²] - E[x]², sums run left to right in float32 like a
    plain loop."""
    x = np.asarray(x, dtype=np.float32)
    n = np.float32(x.shape[-1])
    # the running sum a loop would keep
    mean = np.cumsum(x, axis=-1, dtype=np.float32)[..., -1:] / n
    # cancels when mean² ≫ var
    var = np.cumsum(x * x, axis=-1, dtype=np.float32)[..., -1:] / n - mean * mean
    y = (x - mean) / np.sqrt(np.maximum(var, 0) + np.float32(eps))
    return _affine(y, gamma, beta).astype(np.float32)
