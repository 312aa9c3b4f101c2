"""gloo's ring all-reduce, add for add: the order its CPU all-reduce sums in (gloo/allreduce.cc).

    total = gloo_ring(comm, x)                      # the sum, with gloo's bits
    mean = allreduce_fp16(comm, x, gloo_ring)       # torch's fp16_compress_hook on gloo, exactly

fp16 addition rounds, so (a + b) + c and a + (b + c) can differ in the last bit: a sum is only
reproducible with its order. gloo's ring and ours are the same algorithm (reduce-scatter, then
all-gather, 2(N−1) steps) with two choices made differently, and each changes the bits:

- direction: gloo sends to rank − 1 and receives from rank + 1; chunk k is summed from rank k − 1
  down to rank k (ours goes up, from rank k + 1);
- the chunks: gloo cuts the buffer into ≥ 2N segments of ⌈count / segments⌉ values (at most 1 MiB
  each, a multiple of N in all) and gives each rank whole segments, so the last chunks may be short
  or empty; ours are np.array_split's (sizes differ by at most one).

Where the chunks and the order match, every bit matches: tests/training/test_compress_hooks.py
trains with this on 4 ranks beside torch's own hook on gloo.
"""

from __future__ import annotations

import numpy as np

MAX_SEGMENT_BYTES = 1024 * 1024  # gloo's AllreduceOptions kMaxSegmentSize


def gloo_chunks(count: int, itemsize: int, world_size: int) -> list[slice]:
    """The N slices of a flat buffer that gloo's ring gives ranks 0 … N−1 (ring())."""
    n = world_size
    max_segment = itemsize * max(1, MAX_SEGMENT_BYTES // itemsize)
    wanted = max(-(-count * itemsize // max_segment), 2 * n)
    segments = -(-wanted // n) * n  # rounded up to a multiple of N: as many per rank
    per_chunk = (segments // n) * -(-count // segments)  # whole segments of ⌈count/segments⌉
    return [slice(min(k * per_chunk, count), min((k + 1) * per_chunk, count)) for k in range(n)]


def gloo_ring(comm, x, op: str = "sum") -> np.ndarray:
    """The sum of x over the ranks, added in gloo's order: rank r starts chunk r + 1, passes it to
    r − 1, and each rank adds its own values to what arrives; rank k finishes chunk k."""
    if op != "sum":
        raise ValueError(f"rank {comm.rank}: gloo_ring sums (op='sum'), got op={op!r}")
    n, r = comm.world_size, comm.rank
    x = np.asarray(x)
    flat = x.reshape(-1)
    chunks = [flat[s] for s in gloo_chunks(flat.size, flat.itemsize, n)]  # views: never written
    down, up = (r - 1) % n, (r + 1) % n
    partial = chunks[(r + 1) % n]
    for step in range(n - 1):
        into = (r + 2 + step) % n
        incoming = comm.sendrecv(down, partial, up, "reduce_scatter", step=step,
                                 chunk=(r + 1 + step) % n)
        partial = chunks[into] = chunks[into] + incoming  # gloo: out = out + tmp
    for step in range(n - 1):
        into = (r + 1 + step) % n
        chunks[into] = comm.sendrecv(down, chunks[(r + step) % n], up, "all_gather", step=step,
                                     chunk=(r + step) % n)
    return np.concatenate(chunks).reshape(x.shape)  # a new array, x untouched
