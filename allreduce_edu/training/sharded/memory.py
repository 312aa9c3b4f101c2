"""What a rank holds, counted from its arrays, beside the ZeRO paper's formulas.

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models" (2020),
count model states per rank for Ψ parameters on N ranks with K bytes of optimizer state per
parameter: data parallel (2 + 2 + K)Ψ; ZeRO-1 (optimizer states sharded) 2Ψ + 2Ψ + KΨ/N; ZeRO-2
(gradients too) 2Ψ + (2 + K)Ψ/N; ZeRO-3 (parameters too) (2 + 2 + K)Ψ/N — in mixed precision
(fp16 parameters and gradients, K = 12: fp32 master weights, momentum and variance). In plain fp32
the parameters and gradients take 4 bytes each and K = 8 (the two moments).
"""

from __future__ import annotations

KINDS = ("params", "grads", "optimizer")
BYTES = {"fp32": (4, 4, 8), "mixed": (2, 2, 12)}  # parameter, gradient, optimizer bytes per param
STAGES = ("dp", "zero1", "zero2", "zero3")


def zero_formula(stage: str, psi: int, world_size: int, precision: str = "fp32") -> dict:
    """Bytes per rank for params, grads and optimizer state, as the paper counts them."""
    if stage not in STAGES or precision not in BYTES:
        raise ValueError(f"stage must be one of {STAGES} and precision fp32 or mixed, "
                         f"got {stage!r}, {precision!r}")
    p, g, k = BYTES[precision]
    n = world_size
    sharded = {"dp": (), "zero1": ("optimizer",), "zero2": ("optimizer", "grads"),
               "zero3": ("optimizer", "grads", "params")}[stage]
    full = {"params": p * psi, "grads": g * psi, "optimizer": k * psi}
    return {kind: full[kind] / n if kind in sharded else full[kind] for kind in KINDS}


class Ledger:
    """Bytes this rank holds by kind, now and at the peak of their total: `hold` an array when it
    is made, `free` it when it is dropped."""

    def __init__(self):
        self.now = dict.fromkeys(KINDS, 0)
        self.peak = dict(self.now)

    def hold(self, kind: str, array) -> None:
        self.now[kind] += array.nbytes
        if sum(self.now.values()) > sum(self.peak.values()):
            self.peak = dict(self.now)

    def free(self, kind: str, array) -> None:
        self.now[kind] -= array.nbytes

    def report(self) -> dict:
        return {"now": dict(self.now), "peak": dict(self.peak)}
