"""Overlapping communication with compute: DDP's gradient buckets launched during backward, and
what stays exposed. Introduced in lessons/12_overlap.

PyTorch DDP's reducer (Li et al., 2020) packs gradients into buckets in reverse layer order —
the order backward produces them — and starts each bucket's all-reduce as soon as its last
gradient is ready, so the early buckets travel while backward computes the layers below.
*Exposed communication* is the part of a step during which the rank waits for communication
instead of computing: the step's time minus its compute.

`zero3_pass` is ZeRO-3's (FSDP's `forward_prefetch` / `backward_prefetch`) the same way: the next
layer's all-gather starts before this layer computes.

`predict_exposed` is the α-β model of the same pipeline: buckets are ready when backward has
produced them (measured compute times), one communication thread sends them one after another,
and whatever is left after backward ends is exposed.
"""

from __future__ import annotations

import time

import numpy as np

from ...collectives import allreduce
from ...collectives.nonblocking import iall_gather, iallreduce
from ...model.costmodel import predict
from .layers import loss_and_grads_by_layer, split_unit, units


def bucket_layers(layer_bytes: list[int], bucket_bytes: int | None) -> list[list[int]]:
    """Layers grouped into buckets in backward order (last layer first), each bucket closed once
    it holds at least `bucket_bytes` (None: one bucket per layer), as DDP's bucket_cap_mb."""
    buckets, current, size = [], [], 0
    for layer in reversed(range(len(layer_bytes))):
        current.append(layer)
        size += layer_bytes[layer]
        if bucket_bytes is None or size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


def ddp_step(comm, params: list, X, y, weight: float, lr: float, bucket_bytes: int | None,
             overlap: bool = True) -> dict:
    """One SGD step of data parallel training with gradient buckets; with `overlap`, each
    bucket's all-reduce starts during backward, else all of them after it.

    Returns the new params, the loss share, and the step's timing: compute spans, communication
    spans (per bucket) and the exposed communication, in seconds."""
    layers = len(params) // 2
    layer_bytes = [params[2 * i].nbytes + params[2 * i + 1].nbytes for i in range(layers)]
    buckets = bucket_layers(layer_bytes, bucket_bytes)
    bucket_of = {layer: b for b, members in enumerate(buckets) for layer in members}
    ready: dict[int, list] = {}
    grads: dict[int, tuple] = {}
    requests, spans = {}, []

    def flat(b):
        return np.concatenate([np.concatenate([grads[i][0].reshape(-1), grads[i][1]])
                               for i in buckets[b]]) * weight

    def on_ready(layer, gW, gb):
        grads[layer] = (gW, gb)
        b = bucket_of[layer]
        ready.setdefault(b, []).append(layer)
        if overlap and len(ready[b]) == len(buckets[b]):
            requests[b] = iallreduce(comm, flat(b))  # off it goes, backward continues

    t0 = time.perf_counter()
    loss, _ = loss_and_grads_by_layer(lambda i: (params[2 * i], params[2 * i + 1]), X, y,
                                      on_ready, layers=layers, spans=spans)
    if overlap:
        summed = {b: r.wait() for b, r in requests.items()}
        comm_spans = [(f"bucket {b}", r.t_start, r.t_end) for b, r in requests.items()]
    else:
        summed, comm_spans = {}, []
        for b in range(len(buckets)):
            start = time.perf_counter()
            summed[b] = allreduce(comm, flat(b), "sum", "ring")
            comm_spans.append((f"bucket {b}", start, time.perf_counter()))
    step_time = time.perf_counter() - t0
    new = [p.copy() for p in params]
    for b, members in enumerate(buckets):
        offset = 0
        for i in members:
            for k in (2 * i, 2 * i + 1):
                size = params[k].size
                new[k] -= lr * summed[b][offset:offset + size].reshape(params[k].shape)
                offset += size
    compute = sum(t1 - t0_ for _, _, t0_, t1 in spans)
    return {"params": new, "loss": weight * loss, "t0": t0, "step": step_time,
            "compute": compute, "exposed": step_time - compute, "spans": spans,
            "comm_spans": comm_spans, "buckets": buckets}


def measure_overlap(comm, params: list, X, y, bucket_bytes: int | None, overlap: bool,
                    steps: int = 3, batch: int = 256, lr: float = 0.01) -> dict:
    """Run on every rank: `steps` DDP steps; the last step's timing (the first warms up), and the
    median exposed communication over all but the first."""
    from ..data_parallel import global_batch

    results = []
    for step in range(steps):
        idx = np.array_split(global_batch(step, len(y), batch), comm.world_size)[comm.rank]
        comm.barrier()
        result = ddp_step(comm, params, X[idx], y[idx], len(idx) / batch, lr, bucket_bytes,
                          overlap)
        params = result["params"]
        results.append(result)
    timed = results[1:] or results
    last = dict(timed[-1])
    last["exposed_median"] = float(np.median([r["exposed"] for r in timed]))
    last["step_median"] = float(np.median([r["step"] for r in timed]))
    last.pop("params")
    return last


def predict_exposed(backward_seconds: list[float], layer_bytes: list[int],
                    bucket_bytes: int | None, world_size: int, alpha: float, beta: float,
                    overlap: bool = True) -> float:
    """The α-β model's exposed communication of one DDP step: `backward_seconds[i]` is layer i's
    backward compute, `layer_bytes[i]` its gradient bytes; each bucket is a ring all-reduce."""
    buckets = bucket_layers(layer_bytes, bucket_bytes)
    t, ready = 0.0, {}
    for layer in reversed(range(len(layer_bytes))):  # backward, last layer first
        t += backward_seconds[layer]
        ready[layer] = t
    backward_end, free = t, 0.0
    for members in buckets:
        nbytes = sum(layer_bytes[i] for i in members)
        start = max(max(ready[i] for i in members), free) if overlap else max(backward_end, free)
        free = start + predict("ring", world_size, nbytes, alpha, beta)
    return max(free - backward_end, 0.0)


def zero3_pass(comm, params, X, y, prefetch: bool) -> tuple[float, float]:
    """Run on every rank: one forward and backward of ZeRO-3, each layer's weights all-gathered
    from the ranks' shards when the pass asks for them; with `prefetch`, the next layer's
    all-gather is started before this layer computes. Returns (seconds, loss)."""
    layers = len(params) // 2
    shards = [np.array_split(u, comm.world_size)[comm.rank] for u in units(params)]
    order = list(range(layers)) + list(reversed(range(layers)))  # what the pass asks for
    requests, asked = {}, iter(range(len(order)))

    def weights(layer):
        k = next(asked)
        if k not in requests:
            requests[k] = iall_gather(comm, shards[order[k]])
        if prefetch and k + 1 < len(order):  # the next layer's gather travels while this one
            requests[k + 1] = iall_gather(comm, shards[order[k + 1]])  # computes
        return split_unit(requests.pop(k).wait(), params[2 * layer].shape)

    comm.barrier()
    t0 = time.perf_counter()
    loss, _ = loss_and_grads_by_layer(weights, X, y, layers=layers)
    return time.perf_counter() - t0, loss
