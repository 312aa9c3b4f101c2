"""Lesson 05 · choosing an algorithm: pick by the cost model, predict a crossover, explain the bits.

`check_choose` asks your `choose(nbytes, world_size, alpha, beta)` about sizes from 8 B to 1 GiB,
2 to 512 ranks and three machines, and names the first case where its pick is not the fastest the
model predicts.
"""

from __future__ import annotations

from ..bench import combine, measure
from ..costmodel import crossover, predict
from .feedback import Feedback, failed, passed
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - notebook
from .spec import Blank, Slip, choice, number

#: the algorithms lesson 05 chooses among (lesson 04's four)
CANDIDATES = ("ring", "tree", "recursive_doubling", "rabenseifner")

CHOOSE_SOLUTION = """def choose(nbytes, world_size, alpha, beta):
    return min(["ring", "tree", "recursive_doubling", "rabenseifner"],
               key=lambda algorithm: predict(algorithm, world_size, nbytes, alpha, beta))"""


def measure_rows(cluster, algorithms, sizes, dtype="float32", iters=20, warmup=5,
                 budget=2.0) -> list[dict]:
    """`bench.run`'s rows without its ping-pong (slow over emulated links): time, algbw, busbw for
    each (algorithm, size)."""
    return combine(cluster.run(measure, algorithms, sizes, dtype, iters, warmup, budget))


def _grid():
    """(nbytes, world_size, alpha, beta): 8 B … 1 GiB, 2 … 512 ranks, a laptop and a cluster."""
    sizes = [8 << (2 * k) for k in range(14)] + [3000, 100_000, 777_777, 5_000_000]
    machines = [(300e-6, 1 / 1.0e9), (10e-6, 1 / 20e9), (2e-3, 1 / 50e6)]
    for alpha, beta in machines:
        for world_size in (2, 3, 4, 5, 8, 13, 16, 64, 512):
            for nbytes in sorted(sizes):
                yield nbytes, world_size, alpha, beta


def _describe(alpha: float, beta: float) -> str:
    return f"α = {alpha * 1e6:g} µs, 1/β = {1 / beta / 1e9:g} GB/s"


@exercise(
    "05.1", "choose the fastest algorithm by the model", kind="code", function="choose",
    library=("tuner:tune",),
    solution=CHOOSE_SOLUTION, needs={"predict": predict},
    hints=('No size thresholds needed: the model already prices every algorithm. Ask it for each '
           "of the four candidates' time and keep the fastest.",
           'predict(algorithm, world_size, nbytes, alpha, beta) from allreduce_edu.costmodel '
           '(imported at the top of this lesson) gives the predicted seconds. Mind its argument '
           'order: world_size comes before nbytes.',
           'The key idea: choosing is minimising. Price each candidate for this N, S, α and β, and'
           " return the name whose price is lowest — the same question NCCL's tuner answers with "
           'its own model.'),
    key="""from allreduce_edu.exercises.lesson05 import check_choose, hint, solution

""" + CHOOSE_SOLUTION + """

check_choose(choose)""")
def check_choose(choose) -> Feedback:
    """Exercise 05.1: choose(nbytes, world_size, alpha, beta) names the model's fastest."""
    for nbytes, n, alpha, beta in _grid():
        times = {a: predict(a, n, nbytes, alpha, beta) for a in CANDIDATES}
        best = min(times, key=times.get)
        try:
            got = choose(nbytes, n, alpha, beta)
        except Exception as e:  # noqa: BLE001 - the learner's code: report, don't crash
            return failed(f"choose({nbytes}, {n}, {alpha:g}, {beta:g}) raised "
                          f"{type(e).__name__}: {e}")
        where = f"{nbytes:,} bytes on {n} ranks ({_describe(alpha, beta)})"
        if got not in times:
            return failed(f"for {where} you returned {got!r}; return one of "
                          f"{', '.join(CANDIDATES)}.")
        if times[got] > times[best] * (1 + 1e-9):
            if nbytes <= 1024:
                why = "small messages are priced by α: count the steps"
            elif nbytes >= 1 << 24:
                why = "large messages are priced by β: count the bytes along the way"
            else:
                why = "near a crossover, compare the full formulas, not a fixed threshold"
            return failed(f"at {where} you chose {got} (predicted {times[got] * 1e6:,.1f} µs) but "
                          f"{best} is predicted {times[best] * 1e6:,.1f} µs — {why}; use "
                          f"costmodel.predict for each candidate.")
    return passed("your choice matched the model's fastest algorithm at every size from 8 B to "
                  "1 GiB, for 2 to 512 ranks, on a laptop, a real cluster and a slow emulated "
                  "link.")


check_crossover = number(
    "05.2", "predict the tree/ring crossover", module=__name__, checker="check_crossover",
    question="On a cluster with α = 10 µs and 1/β = 20 GB/s, with 8 ranks: above how many "
             "**bytes** is the ring faster than the tree? Work it out from the two formulas (no "
             "`crossover` call!).",
    setup="alpha_cluster, beta_cluster = 10e-6, 1 / 20e9",
    blanks=(Blank("my_crossover", "bytes: a number, or an expression of alpha_cluster, "
                  "beta_cluster", "8 * alpha_cluster / (4.25 * beta_cluster)"),),
    inputs={"alpha": 10e-6, "beta": 1 / 20e9, "world_size": 8},
    call="alpha_cluster, beta_cluster, world_size=8", unit="bytes",
    answer=lambda d: crossover("tree", "ring", d.world_size, d.alpha, d.beta),
    slips=lambda d: [
        *[Slip(crossover("tree", "ring", d.world_size, d.alpha, d.beta) / scale,
               f"that looks like {unit}: the checker wants bytes.")
          for unit, scale in (("KiB", 1024), ("kB", 1000), ("MiB", 1 << 20), ("MB", 1e6))],
        Slip(d.alpha / d.beta, f"α/β = {d.alpha / d.beta:,.0f} bytes is where one message's α "
             f"equals its bytes·β. The crossover also depends on the step counts and bytes of "
             f"each algorithm on {d.world_size} ranks: set the two formulas equal and solve for "
             f"S."),
        Slip(_one_phase_tree(d), "the tree has two phases, reduce and broadcast: 2·⌈log2 N⌉ "
             "steps, each moving the whole buffer."),
    ],
    otherwise=lambda d, name, got: (
        f"off by a factor {got / crossover('tree', 'ring', d.world_size, d.alpha, d.beta):.2f}: "
        f"tree = 2⌈log2 N⌉(α + Sβ), ring = 2(N−1)α + 2(N−1)/N·Sβ; set them equal and solve for S."),
    success=lambda d: _crossover_success(d),
    hints=("Write both times for N = 8 as a·α + b·S·β: the tree takes 2⌈log2 8⌉ steps, each "
           "moving the whole buffer S; the ring takes 2(N − 1) steps and moves 2(N − 1)/N·S "
           "along the way.",
           "Set the two equal, 6α + 6·S·β = 14α + 1.75·S·β, and solve for S. β is seconds per "
           "byte, as beta_cluster = 1 / 20e9 already is."),
    solution="""Both times are straight lines in S; set them equal and solve for S. On N = 8 ranks:
    tree: 2·⌈log2 8⌉·(α + S·β) = 6α + 6·S·β
    ring: 2·(8 − 1)·α + 2·(8 − 1)/8·S·β = 14α + 1.75·S·β
    6α + 6Sβ = 14α + 1.75Sβ  →  S = 8α / (4.25β) ≈ 1.88·α/β
With α = 10 µs and 1/β = 20 GB/s: α/β = 200,000 bytes, so S ≈ 376,000 bytes (≈ 367 KiB).
crossover("tree", "ring", 8, alpha, beta) computes it.""")


def _one_phase_tree(d) -> float:
    log, slope = (d.world_size - 1).bit_length(), 2 * (d.world_size - 1) / d.world_size
    return (2 * (d.world_size - 1) - log) * d.alpha / ((log - slope) * d.beta)


def _crossover_success(d) -> str:
    want = crossover("tree", "ring", d.world_size, d.alpha, d.beta)
    return (f"{want:,.0f} bytes ({want / 1024:,.0f} KiB) = {want * d.beta / d.alpha:.2f}·α/β: "
            f"below it the tree's fewer steps win, above it the ring's smaller messages.")


check_float_order_answer = choice(
    "05.3", "ring and tree on integers", module=__name__, checker="check_float_order_answer",
    question="Ring and tree all-reduce the same float32 inputs and disagree in the last bits. "
             "Run them instead on int32 token counts (no sum overflows). The two results",
    options={
        "a": "differ in the last bits too: any two orders of addition round differently.",
        "b": "agree only when N is a power of two, so that the tree is balanced.",
        "c": "differ on some machines: each CPU rounds its integer sums its own way.",
        "d": "agree bit for bit: integer sums are exact, so grouping cannot matter.",
    },
    right="d",
    slips={
        "a": "rounding happens only when a result has more digits than its type can hold: float "
             "addition rounds, integer addition (without overflow) is exact.",
        "b": "an unbalanced tree groups the additions differently, but for integers grouping "
             "does not matter: (a + b) + c = a + (b + c) exactly.",
        "c": "integer addition has one right answer and every CPU gives it (two's complement); "
             "only floating point rounds.",
    },
    why="the float results differ because float addition rounds after every step, so it is not "
        "associative and the ring and the tree group the additions differently. Integer addition "
        "is exact and associative: any algorithm, any N, the same bits. Deterministic float "
        "reductions need a fixed order instead (NCCL_ALGO pinned, or fixed-point sums).",
    hints=("Why do float32 results depend on the order of the additions at all?",
           "Does integer addition ever round? Then can the grouping of the additions change the "
           "sum?"))


def measured_crossover(rows, a: str = "tree", b: str = "ring") -> tuple[int | None, int] | None:
    """From measured rows: (the size below, the first size from which `b` stays faster than `a`).

    The size below is None when `b` is faster at every measured size; the answer is None when `b`
    is not faster at the largest size (no crossover in the range)."""
    times = {(r["algorithm"], r["bytes"]): r["time_us"] for r in rows}
    sizes_of = {name: {s for (n, s) in times if n == name} for name in (a, b)}
    sizes = sorted(sizes_of[a] & sizes_of[b])
    for i, size in enumerate(sizes):
        if all(times[b, s] < times[a, s] for s in sizes[i:]):
            return (sizes[i - 1] if i > 0 else None, size)
    return None


def interpolated_crossover(rows, a: str = "tree", b: str = "ring") -> float | None:
    """From measured rows: the size in bytes where `b` becomes faster than `a`, on the straight
    line between the two measured sizes around it (times are straight lines in the size).

    None when `b` is not faster at the largest size; the smallest size when `b` is faster at
    every size."""
    found = measured_crossover(rows, a, b)
    if found is None:
        return None
    below, first = found
    if below is None:
        return float(first)
    times = {(r["algorithm"], r["bytes"]): r["time_us"] for r in rows}
    # b's lead over a: ≤ 0 at `below` (a no slower), > 0 at `first`
    lead_below, lead_first = (times[a, s] - times[b, s] for s in (below, first))
    return below + (first - below) * -lead_below / (lead_first - lead_below)
