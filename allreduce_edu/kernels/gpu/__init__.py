"""The fused norm kernels on a GPU with numba-cuda, and on the CUDA simulator where there is none.
Introduced in lessons/14_gpu_kernels.

    from allreduce_edu import gpu
    gpu.simulated()                      # True on a laptop: every CUDA thread is a Python thread
    gpu.layernorm(x, gamma, beta)        # the same call as allreduce_edu.kernels.cpu.layernorm

Importing this package picks the target once: a real GPU when the CUDA driver finds one, else the
simulator (`NUMBA_ENABLE_CUDASIM=1`, unless you set that variable yourself). The kernels are the
same code on both. numba-cuda and the CUDA runtime the simulator needs install with the package
(Linux, Windows; no macOS build exists); a real GPU needs the [gpu] extra as well:
`pip install -e ".[gpu]"`.
"""

from __future__ import annotations

from .block import MAX_THREADS, block_sum, block_trace, schedule, threads_for
from .layernorm import add_layernorm, layernorm, rmsnorm
from .target import cuda, simulated  # imported by the others first: it picks the target

__all__ = ["simulated", "layernorm", "add_layernorm", "rmsnorm", "block_sum", "schedule",
           "block_trace", "threads_for", "MAX_THREADS", "cuda"]
