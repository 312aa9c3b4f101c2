"""Sharded data parallel (ZeRO-1/2/3, FSDP) and overlapped communication, on lesson 08's MLP.

    zero.train(comm, params, X, y, stage="zero1")   # dp, zero1, zero2, zero3: same weights
    memory.zero_formula(stage, psi, N, "mixed")     # the ZeRO paper's bytes per rank
    overlap.train_overlapped(comm, ...)             # gradient buckets during backward; prefetch
"""

from .memory import STAGES, Ledger, zero_formula
from .zero import Rank, train

__all__ = ["STAGES", "Ledger", "zero_formula", "Rank", "train"]
