"""Fewer bytes on the wire: gradient compression on the package's collectives.

    allreduce_fp16(comm, x, algorithm="ring")   # divide by N first, then sum in fp16
    allreduce_bf16(comm, x)                     # bf16 bits, summed hop by hop around the ring
    allreduce_fp8(comm, x, hops="once")         # e4m3 quantized twice, or at every hop
    PowerSGD(rank=1)                            # P = MQ, Q = MᵀP: (n+m)·r values, not n·m
    OneBit()                                    # signs + a scale per chunk, two error buffers
    train(cluster, scheme, steps)               # lesson 08's model: losses, bytes per step
    FP16(gloo_ring)                             # summed in gloo's order: torch's hook's bits

Every scheme averages one flat bucket of gradients, `scheme.mean(comm, flat, shapes, key)`, and
says what it sends, `scheme.bytes_per_step(shapes, dtype, world_size)`, which equals what the
trace counts. The all-reduce inside Scheme, FP16 and PowerSGD is any algorithm name or your own
`fn(comm, x)`. Error feedback (feedback.py) keeps what a biased compressor drops for next step.
"""

from .casts import allreduce_bf16, allreduce_fp8, allreduce_fp16, ring_bytes
from .feedback import ErrorFeedback, error_feedback_step
from .gloo_order import gloo_ring
from .onebit import OneBit
from .powersgd import PowerSGD, compression_ratio
from .schemes import BF16, FP8, FP16, Scheme
from .train import compare, train, train_on_rank

SCHEMES = {s.name: s for s in (Scheme, FP16, BF16, FP8, PowerSGD, OneBit)}  # name -> class

__all__ = ["allreduce_fp16", "allreduce_bf16", "allreduce_fp8", "ring_bytes", "ErrorFeedback",
           "error_feedback_step", "OneBit", "PowerSGD", "compression_ratio", "Scheme", "FP16",
           "BF16", "FP8", "gloo_ring", "train", "compare", "train_on_rank", "SCHEMES"]
