"""Sharded data parallel (ZeRO-1/2/3, FSDP) and overlapped communication, on lesson 08's MLP.

    zero.train(comm, params, X, y, stage="zero1")   # dp, zero1, zero2, zero3: same weights
    memory.zero_formula(stage, psi, N, "mixed")     # the ZeRO paper's bytes per rank
    overlap.ddp_step(comm, ...)                     # gradient buckets during backward
    overlap.zero3_pass(comm, ..., prefetch=True)    # ZeRO-3 with the next layer prefetched
"""

from .memory import STAGES, Ledger, zero_formula
from .zero import Rank, train

__all__ = ["STAGES", "Ledger", "zero_formula", "Rank", "train"]
