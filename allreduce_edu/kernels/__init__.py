"""The kernels: what runs on the bytes once they have arrived.

    cpu         Numba: the reduction step of every all-reduce, fused sum + LayerNorm/RMSNorm per row
    reference   plain NumPy float64, what the kernels are tested against
    gpu/        the same on a GPU with numba-cuda (extra `[gpu]`; lesson 14)

`from allreduce_edu import kernels` gives the CPU kernels' public names.
"""

from .cpu import (
    NORMS,
    NUMBA_MIN_SIZE,
    add_layernorm,
    compile_all,
    layernorm,
    reduce_into,
    rmsnorm,
    sum_layernorm,
)

__all__ = ["NORMS", "NUMBA_MIN_SIZE", "add_layernorm", "compile_all", "layernorm", "reduce_into",
           "rmsnorm", "sum_layernorm"]
