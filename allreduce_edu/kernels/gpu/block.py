"""A block's tree reduction: threads as ranks, shared memory as the wire, `syncthreads()` as the
step. Introduced in lessons/14_gpu_kernels: lesson 04's tree all-reduce at the second scale.

    step 0  threads t < 4 add shared[t + 4]      (8 threads, stride 4)
    step 1  threads t < 2 add shared[t + 2]      (stride 2)
    step 2  thread 0 adds shared[1]              (stride 1): shared[0] holds the block's sum
"""

from __future__ import annotations

import numpy as np

from ...trace import Event, Trace
from .target import cuda, simulated

MAX_THREADS = 1024  # CUDA's limit per block: block_sum's shared scratch holds one float64 each
GPU_THREADS = 256  # threads per row on a GPU (a row of 4096 float32: 16 elements per thread)
SIM_THREADS = 32  # one warp in the simulator, where every thread is a Python thread
# how each step picks its pairs: "sequential" (the kernels': the active threads stay contiguous,
# so whole warps retire) or "interleaved" (stride 1, 2, 4, ...: lesson 04's binomial tree exactly)
ADDRESSING = ("sequential", "interleaved")
# the registered algorithm whose animation layout draws each schedule's messages on its links:
# interleaved pairs are the binomial tree's; sequential pairs t + s = t xor s, hypercube edges
DRAWN_AS = {"interleaved": "tree", "sequential": "recursive_doubling"}


@cuda.jit(device=True)
def block_sum(value, shared):
    """The sum of every thread's `value`, returned to every thread of the block (blockDim.x a power
    of two; `shared` holds one float64 per thread)."""
    t = cuda.threadIdx.x
    shared[t] = value
    cuda.syncthreads()  # every thread's partial is in shared memory before anyone reads it
    s = cuda.blockDim.x // 2
    while s > 0:
        # step: thread t < s adds the partial of thread t + s (the upper half folds onto the lower)
        if t < s:
            shared[t] += shared[t + s]
        cuda.syncthreads()  # this step's partials are written before the next step reads them
        s //= 2
    total = shared[0]
    cuda.syncthreads()  # every thread has read shared[0] before a later block_sum overwrites it
    return total


def threads_for(hidden: int) -> int:
    """Threads per block for rows of `hidden`: a power of two, no more than the row needs, up to
    GPU_THREADS (SIM_THREADS in the simulator, which starts a Python thread for each)."""
    most = SIM_THREADS if simulated() else GPU_THREADS
    return min(most, 1 << max(hidden - 1, 0).bit_length())


def schedule(threads: int, addressing: str = "sequential") -> list[list[tuple[int, int]]]:
    """The tree's steps: each a list of (src, dst): thread dst adds the partial of thread src."""
    if threads < 1 or threads & (threads - 1):
        raise ValueError(f"a block's tree needs a power-of-two number of threads, got {threads}")
    if addressing not in ADDRESSING:
        raise ValueError(f"addressing must be one of {', '.join(ADDRESSING)}, got {addressing!r}")
    steps = []
    strides = [threads >> (k + 1) for k in range(threads.bit_length() - 1)]
    for s in (strides if addressing == "sequential" else strides[::-1]):
        if addressing == "sequential":  # the lower s threads each add the one s above them
            steps.append([(t + s, t) for t in range(s)])
        else:  # every 2s-th thread adds the one s to its right
            steps.append([(t + s, t) for t in range(0, threads, 2 * s)])
    return steps


def partials(values, addressing: str = "sequential") -> list[np.ndarray]:
    """What each thread's shared slot holds before the tree (index 0) and after each step."""
    held = [np.asarray(values, dtype=np.float64).copy()]
    for step in schedule(len(held[0]), addressing):
        now = held[-1].copy()
        for src, dst in step:
            now[dst] += held[-1][src]
        held.append(now)
    return held


def block_trace(threads: int = 8, addressing: str = "sequential") -> Trace:
    """The tree as a Trace of messages (thread src → thread dst, one float64 each), for the
    animations of lessons 03-05: threads as ranks."""
    collective = f"block_sum/{DRAWN_AS.get(addressing, addressing)}"
    return Trace([Event(src, dst, "reduce", k, 8, float(k), float(k), collective=collective,
                        via="shared memory")
                  for k, step in enumerate(schedule(threads, addressing)) for src, dst in step])
