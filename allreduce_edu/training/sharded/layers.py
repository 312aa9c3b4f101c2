"""Lesson 08's MLP, one layer at a time: the forward and backward passes ask for each layer's
weights just before they use them and hand over each layer's gradients as soon as they exist.

That is the shape every sharded or overlapped trainer needs: ZeRO-3/FSDP all-gathers a layer's
weights in `weights(layer)` and frees them after; DDP and ZeRO-2 start reducing a layer's gradients
in `grads_ready(layer, ...)` while the backward pass goes on to the layers below (reverse order).
The arithmetic is training.loss_and_grads', step for step, so the gradients are the same.
"""

from __future__ import annotations

import time

import numpy as np

from ..data_parallel import softmax_cross_entropy


def units(params: list) -> list[np.ndarray]:
    """Each layer's W and b as one flat vector: the unit a sharded trainer gathers and scatters."""
    return [np.concatenate([W.reshape(-1), b]) for W, b in zip(params[::2], params[1::2],
                                                               strict=True)]


def split_unit(flat: np.ndarray, W_shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    """A layer's flat vector back into (W, b) views (padding, if any, at the end is ignored)."""
    n = W_shape[0] * W_shape[1]
    return flat[:n].reshape(W_shape), flat[n:n + W_shape[1]]


def loss_and_grads_by_layer(weights, X: np.ndarray, y: np.ndarray, grads_ready=None, *,
                            layers: int, spans: list | None = None):
    """Softmax cross-entropy of the MLP and its gradients, one layer at a time.

    `weights(layer)` returns that layer's (W, b) when the pass needs it (forward, then again in
    backward); `grads_ready(layer, gW, gb)` is called as soon as a layer's gradients exist, last
    layer first. `spans`, if given, gets ("forward" | "backward", layer, t0, t1) for each layer's
    arithmetic (perf_counter seconds; the time inside `weights` and `grads_ready` is not in them).
    Returns (loss, [gW0, gb0, gW1, gb1, ...])."""
    clock = time.perf_counter
    hidden = [X]  # the input of each layer
    for layer in range(layers - 1):
        W, b = weights(layer)
        t0 = clock()
        hidden.append(np.tanh(hidden[-1] @ W + b))
        _span(spans, "forward", layer, t0)
    W, b = weights(layers - 1)
    t0 = clock()
    loss, delta = softmax_cross_entropy(hidden[-1] @ W + b, y)
    _span(spans, "forward", layers - 1, t0)
    grads = [None] * (2 * layers)
    for layer in reversed(range(layers)):
        W, _ = weights(layer)  # again: as FSDP's pre-backward hook gathers each layer again
        t0 = clock()
        gW, gb = hidden[layer].T @ delta, delta.sum(axis=0)
        grads[2 * layer], grads[2 * layer + 1] = gW, gb
        if layer:
            delta = (delta @ W.T) * (1 - hidden[layer] ** 2)  # back through tanh
        _span(spans, "backward", layer, t0)
        if grads_ready is not None:
            grads_ready(layer, gW, gb)
    return float(loss), grads


def _span(spans, kind: str, layer: int, t0: float) -> None:
    if spans is not None:
        spans.append((kind, layer, t0, time.perf_counter()))
