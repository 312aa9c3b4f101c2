"""Lesson 04 · tree all-reduce: write a binomial reduce, predict step counts, explain the crossover.

`check_tree_reduce` runs your `my_tree_reduce(comm, x)` on real gRPC ranks and reads their trace:
it names the first rank that sent to the wrong partner, sent twice, or sent less than its partial.
"""

from __future__ import annotations

import numpy as np

from ..collectives import allreduce
from ..comm.errors import CollectiveTimeout
from ..runtime import Cluster
from .feedback import Feedback, failed, passed
from .harness import run_on_ranks, with_own_input
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - notebook
from .spec import Blank, Slip, choice, number


def _inputs(world_size: int, length: int) -> list[np.ndarray]:
    """Rank r contributes 2^r · (1, 2, 3, 4, 5, 1, ...): element 0 of a sum names its ranks."""
    pattern = 1.0 + np.arange(length) % 5
    return [2.0 ** r * pattern for r in range(world_size)]


def _ranks_in(value: float, world_size: int) -> set[int] | None:
    """The set of ranks whose 2^r make up `value`, or None when it is not such a sum."""
    if not float(value).is_integer() or not 0 <= value < 2 ** world_size:
        return None
    return {r for r in range(world_size) if int(value) >> r & 1}


def _parent(rank: int) -> int:
    return rank & (rank - 1)  # rank - 2^s, s its lowest set bit


def _why_failed(e: Exception) -> str:
    text = str(e)
    if "is not a rank of this world" in text:
        return (" A rank asked for a partner outside the world: receive from rank + 2^s only when "
                "it is < world_size.")
    if isinstance(e, (CollectiveTimeout, TimeoutError)):
        return (" Some rank waited for a message that never came: each rank with bit s set sends "
                "once to rank - 2^s and stops; the others receive from rank + 2^s (when it exists) "
                "before moving on.")
    return ""


@exercise("04.1", kind="code", function="my_tree_reduce", library=("collectives.tree:reduce_tree",))
def check_tree_reduce(fn, worlds=((3, 7), (4, 1), (5, 100_003))) -> Feedback:
    """Exercise 04.1: `fn(comm, x)` sums x to rank 0 along a binomial tree; on real gRPC ranks."""
    for world_size, length in worlds:
        inputs = _inputs(world_size, length)
        nbytes = inputs[0].nbytes
        with Cluster(world_size, timeout=5) as cluster:
            results, failure = run_on_ranks(cluster, with_own_input, fn, inputs)
            if failure:
                e = failure.error
                return failed(f"on {world_size} ranks your function raised {type(e).__name__}: {e}."
                              f"{_why_failed(e)}")
            events = list(cluster.trace.events)
        problem = _tree_problem(events, results, inputs, world_size, nbytes)
        if problem:
            return failed(f"on {world_size} ranks {problem}")
    return passed("rank 0 held the exact sum on 3, 4 and 5 gRPC ranks; every other rank sent once, "
                  "to rank − (its lowest set bit): ⌈log2 N⌉ steps.")


def _tree_problem(events, results, inputs, world_size: int, nbytes: int) -> str | None:
    """The first thing wrong with a binomial reduce's messages or rank 0's result, or None."""
    sends = {rank: [e for e in events if e.src == rank] for rank in range(world_size)}
    if sends[0]:
        return (f"rank 0 sent to rank {sends[0][0].dst}: rank 0 is the root of the reduce, it only "
                f"receives.")
    for rank in range(1, world_size):
        mine, parent = sends[rank], _parent(rank)
        s = (rank & -rank).bit_length() - 1
        if not mine:
            return (f"rank {rank} never sent its partial sum: in a binomial tree rank {rank} sends "
                    f"to rank {parent} ({rank} − 2^{s}), at step {s}.")
        first = mine[0]
        if first.dst != parent:
            at = f" at step {first.step}" if first.step >= 0 else ""
            return (f"rank {rank} sent to rank {first.dst}{at}, but in a binomial tree rank {rank} "
                    f"sends to rank {parent} ({rank} − 2^{s}): the lowest set bit of {rank} is "
                    f"2^{s}.")
        if len(mine) > 1:
            to = ", then ".join(str(e.dst) for e in mine)
            return (f"rank {rank} sent {len(mine)} messages (to {to}): in a binomial tree each "
                    f"rank sends its partial once and is then done — stop (break/return) after the "
                    f"send.")
        if first.nbytes != nbytes:
            return (f"rank {rank} sent {first.nbytes} bytes, but its partial sum is the whole "
                    f"buffer ({nbytes} bytes): every tree step moves all of it.")
    got = results[0]
    if got is None:
        return "rank 0 returned None: return the reduced array on rank 0."
    got, expected = np.asarray(got), np.sum(inputs, axis=0)
    if got.shape != expected.shape:
        return (f"rank 0 returned shape {got.shape}; the reduce keeps the input's shape "
                f"{expected.shape}.")
    if np.array_equal(got, expected):
        return None
    ranks = _ranks_in(got.reshape(-1)[0], world_size) if got.size else None
    if ranks is not None and ranks != set(range(world_size)):
        missing = sorted(set(range(world_size)) - ranks)
        via = {_parent(m) for m in missing if _parent(m) != 0}
        why = (f" rank {min(via)} received from rank {min(missing)} but forwarded less: add what "
               f"you receive into your partial before you send it on." if via else
               " rank 0 must add every message it receives.")
        return f"rank 0's result is missing the data of rank(s) {missing}.{why}"
    return (f"rank 0 holds {got.reshape(-1)[:3]}…, but the sum over ranks starts "
            f"{expected.reshape(-1)[:3]}…: each rank adds what it receives to its own x.")


def trace_of(algorithm: str, world_size: int, count: int = 1024, dtype="float32"):
    """The trace of one all-reduce of `count` elements per rank, on thread ranks: instant."""
    with Cluster(world_size, transport="local") as cluster:
        cluster.run(lambda comm: allreduce(comm, np.ones(count, dtype), algorithm=algorithm))
        return cluster.trace


def step_summary(trace) -> str:
    """One line per phase, `reduce  | step 0: 1→0 3→2 | step 1: 2→0`: who sends to whom per step."""
    phases: dict[str, dict[int, list[str]]] = {}
    for e in sorted(trace.events, key=lambda e: (e.step, e.src)):
        phases.setdefault(e.tag, {}).setdefault(e.step, []).append(f"{e.src}→{e.dst}")
    order = list(trace.steps())
    lines = []
    for tag, steps in sorted(phases.items(), key=lambda item: order.index(item[0])):
        line = " | ".join(f"step {s}: {' '.join(sends)}" for s, sends in sorted(steps.items()))
        lines.append(f"{tag:<14} | {line}")
    return "\n".join(lines)


def count_steps(algorithm: str, world_size: int) -> int:
    """Total steps (all phases) of one all-reduce, read from a local trace."""
    return sum(trace_of(algorithm, world_size, count=world_size).steps().values())


number("04.2", module=__name__,
       blanks=(Blank("my_tree", key="8", keyword="tree"),
               Blank("my_recursive_doubling", key="5", keyword="recursive_doubling")),
       inputs={"world_size": 13}, unit="steps", exact=True,
       answer=lambda d: {"tree": count_steps("tree", d.world_size),
                      "recursive_doubling": count_steps("recursive_doubling", d.world_size)},
       slips=lambda d: _step_slips(d.world_size),
       otherwise=lambda d, name, got: (
        "the tree needs ⌈log2 N⌉ steps per phase, and it has two phases (reduce, broadcast)."
        if name == "tree" else "count fold (1) + exchanges among p ranks, the largest power of "
                               "two below N (log2 p), + unfold (1)."),
       success=lambda d: _steps_success(d.world_size))


def _step_slips(n: int) -> list:
    log, p = (n - 1).bit_length(), 1 << (n.bit_length() - 1)  # ⌈log2 N⌉; the power of two below
    return [
        Slip(log, f"{log} is one phase: the tree all-reduce is a reduce and then a broadcast, "
                  f"⌈log2 {n}⌉ steps each.", "tree"),
        Slip(n - 1, f"{n - 1} is the ring's count per phase; the tree's depth is ⌈log2 N⌉.",
             "tree"),
        Slip(2 * (n - 1), f"{2 * (n - 1)} is the ring's count (N − 1 per phase); the tree's depth "
                          f"is ⌈log2 N⌉.", "tree"),
        Slip(2 * (log - 1), f"log2 {n} is not a whole number: round it up — {n} ranks need a tree "
                            f"of depth {log}, as {1 << log} would.", "tree"),
        Slip(p.bit_length() - 1, f"that counts the exchanges among the {p} ranks left after "
                                 f"folding; {n} is not a power of two, so add the fold and the "
                                 f"unfold steps.", "recursive_doubling"),
        Slip(log, f"recursive doubling does not round up: it folds the {n - p} extra ranks into "
                  f"partners (a step), exchanges among {p} (log2 {p} steps), then unfolds (a "
                  f"step).", "recursive_doubling"),
        Slip(2 * log, "recursive doubling has one exchange phase, not two: each step both reduces "
                      "and spreads the result.", "recursive_doubling"),
        Slip(2 * (p.bit_length() - 1), "recursive doubling has one exchange phase, not two: each "
                                       "step both reduces and spreads the result.",
             "recursive_doubling"),
    ]


def _steps_success(n: int) -> str:
    tree, rd = count_steps("tree", n), count_steps("recursive_doubling", n)
    return (f"tree: {tree} steps ({tree // 2} reduce + {tree // 2} broadcast); recursive "
            f"doubling: {rd} (fold, {rd - 2} exchanges, unfold) — the ring would take "
            f"{2 * (n - 1)}.")


choice("04.3", module=__name__)


def bytes_per_step(trace) -> dict[tuple[str, int], int]:
    """The largest message of each (phase, step): a step's cost in bytes when ranks send at once."""
    out: dict[tuple[str, int], int] = {}
    for e in trace.events:
        out[e.tag, e.step] = max(out.get((e.tag, e.step), 0), e.nbytes)
    return out
