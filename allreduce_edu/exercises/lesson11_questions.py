"""Lesson 11's number exercises as data (11.2, 11.3); lesson11.py re-exports the checkers."""

from __future__ import annotations

from ..training.sharded.memory import zero_formula
from .spec import Blank, Slip, number

LESSON = "allreduce_edu.exercises.lesson11"  # where the notebook imports them from


check_zero2_bytes = number(
    "11.2", "ZeRO-2's bytes per rank", module=LESSON, checker="check_zero2_bytes",
    question="Before you measure: how many bytes of model states does one rank hold under "
             "ZeRO-2, for Ψ = 1.5 billion parameters on N = 8 ranks, in mixed precision "
             "(K = 12)?",
    setup="psi, N, K = 1.5e9, 8, 12   # parameters, ranks, Adam's bytes per parameter (mixed)",
    blanks=(Blank("my_bytes", "bytes per rank: a number, or an expression of psi, N, K",
                  "2 * psi + (2 + K) * psi / N"),),
    inputs={"psi": 1.5e9, "world_size": 8}, call="psi, N", unit="bytes",
    answer=lambda d: sum(zero_formula("zero2", d.psi, d.world_size, "mixed").values()),
    slips=lambda d: _zero2_slips(d.psi, d.world_size),
    otherwise=lambda d, name, got: (
        f"off by ×{got / sum(zero_formula('zero2', d.psi, d.world_size, 'mixed').values()):.3g}. "
        f"Add the three parts one by one: parameters, gradients, optimizer states "
        f"(hint(\"11.2\"))."),
    success=lambda d: _zero2_success(d.psi, d.world_size),
    hints=("Count three parts: parameters, gradients, optimizer states. In mixed precision the "
           "parameters and gradients are fp16 (2 bytes each) and Adam keeps K = 12 bytes of fp32 "
           "per parameter (master weights, m and v).",
           "ZeRO-2 shards the optimizer states (stage 1) and the gradients (stage 2): each rank "
           "keeps 1/N of those two, and all of the parameters."),
    solution="""2Ψ + (2 + K)·Ψ/N = 2 × 1.5e9 + 14 × 1.5e9 / 8 = 3e9 + 2.625e9 = 5.625e9 bytes:
all the fp16 parameters (2Ψ), and 1/N of the fp16 gradients (2Ψ/N) and of Adam's K = 12
bytes of fp32 per parameter (KΨ/N). zero_formula("zero2", psi, N, "mixed") agrees.""")


def _gb(x: float) -> str:
    return f"{x / 1e9:.4g} GB"


def _zero2_slips(psi: float, n: int) -> list:
    return [Slip(sum(zero_formula("zero2", psi, n, "mixed").values()) / 1e9,
                 "that looks like GB: answer in bytes."),
            Slip(4 * psi + 12 * psi / n, "the gradients are not divided by N: 4Ψ + KΨ/N is "
                 "ZeRO-1, which shards only the optimizer states. ZeRO-2 keeps only its 1/N of "
                 "the gradients too."),
            Slip(4 * psi + 16 * psi / n, "you counted 4-byte parameters and gradients: in mixed "
                 "precision they are fp16, 2 bytes each; the fp32 copy of the weights is one of "
                 "the K = 12 bytes."),
            Slip(16 * psi, "that is data parallel's (2 + 2 + K)Ψ, nothing sharded. ZeRO-2 shards "
                 "the gradients and the optimizer states."),
            Slip(16 * psi / n, "that is ZeRO-3's (2 + 2 + K)Ψ/N. ZeRO-2 still keeps every "
                 "parameter on every rank: 2Ψ bytes of fp16."),
            Slip(14 * psi / n, "you left out the parameters: ZeRO-2 keeps all of them on every "
                 "rank."),
            Slip(2 * psi + 2 * psi / n + 12 * psi, "the optimizer states are sharded too (stage "
                 "1; stage 2 adds the gradients): KΨ/N."),
            Slip(2 * psi + 10 * psi / n, "K = 8 counts m and v alone; mixed precision adds the "
                 "fp32 master weights: K = 12.")]


def _zero2_success(psi: float, n: int) -> str:
    want = sum(zero_formula("zero2", psi, n, "mixed").values())
    return (f"{want:,.0f} bytes = 2Ψ + (2 + K)Ψ/N, {_gb(want)}: all the fp16 parameters "
            f"({_gb(2 * psi)}), 1/{n} of the gradients and of Adam's state. Data parallel holds "
            f"{_gb(16 * psi)}, ZeRO-1 {_gb(4 * psi + 12 * psi / n)}, ZeRO-3 "
            f"{_gb(16 * psi / n)}.")


check_zero3_traffic = number(
    "11.3", "ZeRO-3's bytes per step", module=LESSON, checker="check_zero3_traffic",
    question="How many bytes does one rank send in one ZeRO-3 step, for Ψ = 1.5 billion "
             "parameters on N = 8 ranks, with b = 2 bytes per element (fp16) on the wire?",
    setup="psi, N, b = 1.5e9, 8, 2   # parameters, ranks, bytes per element on the wire (fp16)",
    blanks=(Blank("my_bytes", "bytes per rank per step: a number, or an expression",
                  "3 * (N - 1) / N * psi * b"),),
    inputs={"psi": 1.5e9, "world_size": 8, "itemsize": 2}, call="psi, N, b", unit="bytes",
    answer=lambda d: 3 * _one_collective(d),
    slips=lambda d: [
        Slip(3 * _one_collective(d) / 1e9, "that looks like GB: answer in bytes."),
        Slip(2 * _one_collective(d), "that is data parallel's 2(N−1)/N·Ψ·b (ZeRO-1's and "
             "ZeRO-2's too). ZeRO-3 drops each layer's gathered weights once forward has used "
             "them, so backward all-gathers them again: count that all-gather too."),
        Slip(4 * _one_collective(d), "one collective too many: no all-gather after the update "
             "(each rank updates the shard it keeps, and keeps only that), and the gradients "
             "need a reduce-scatter, not an all-reduce (twice the bytes)."),
        Slip(3 * d.psi * d.itemsize, "each ring collective sends (N − 1)/N of the buffer, not "
             "all of it."),
        Slip(3 * _one_collective(d) / d.itemsize, "that counts elements: multiply by b bytes "
             "each."),
        Slip(_one_collective(d), "that is one collective's bytes; a ZeRO-3 step runs three."),
        Slip(3 * _one_collective(d) * 4 / d.itemsize, "the parameters and gradients travel in "
             f"fp16 here: b = {d.itemsize}, not 4."),
    ],
    otherwise=lambda d, name, got: (
        f"off by ×{got / (3 * _one_collective(d)):.3g}. List one step's collectives and what each "
        f"one covers (hint(\"11.3\"))."),
    success=lambda d: (
        f"{3 * _one_collective(d):,.0f} bytes = 3(N−1)/N·Ψ·b: two all-gathers of the parameters "
        f"(forward, then backward) and a reduce-scatter of the gradients, 1.5× data parallel's "
        f"{2 * _one_collective(d):,.0f}. The next cell counts it in the trace."),
    hints=("List one ZeRO-3 step's collectives. Forward needs each layer's full weights, which no "
           "rank keeps; backward needs them again, after forward dropped them; the gradients end "
           "up sharded.",
           "Two all-gathers of the parameters (before forward, before backward) and one "
           "reduce-scatter of the gradients. Each sends (N − 1)/N of the Ψ·b bytes it covers."),
    solution="""3(N − 1)/N · Ψ · b = 3 × 7/8 × 1.5e9 × 2 = 7.875e9 bytes per rank per step:
an all-gather of the fp16 parameters before forward, another before backward (forward
dropped them), and a reduce-scatter of the gradients, (N − 1)/N·Ψ·b each. No all-gather
after the update: each rank updates the shard it keeps. 1.5× DP's 2(N − 1)/N·Ψ·b.""")


def _one_collective(d) -> float:
    """Bytes one rank sends in one ring collective over the whole model."""
    return (d.world_size - 1) / d.world_size * d.psi * d.itemsize
