"""Adam (Kingma & Ba, 2015) on flat arrays, in place: the optimizer whose state ZeRO shards.

Per parameter it keeps two moments, m and v, in fp32 (8 bytes); mixed-precision training adds an
fp32 master copy of the weights (4 more): the K = 12 bytes per parameter of the ZeRO paper.
"""

from __future__ import annotations

import numpy as np


def adam(param: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray, step: int,
         lr: float = 1e-2, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8) -> None:
    """One Adam step on `param` (and its moments m, v), all in place; `step` counts from 1.
    Elementwise, so updating a shard gives exactly that shard of the full update."""
    m *= beta1
    m += (1 - beta1) * grad
    v *= beta2
    v += (1 - beta2) * grad * grad
    m_hat = m / (1 - beta1 ** step)
    v_hat = v / (1 - beta2 ** step)
    param -= lr * m_hat / (np.sqrt(v_hat) + eps)
