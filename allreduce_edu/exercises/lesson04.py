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
from .texts import message


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
        return (message(__name__, "04.1", "rank-asked-for"))
    if isinstance(e, (CollectiveTimeout, TimeoutError)):
        return (message(__name__, "04.1", "some-rank-waited"))
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
    return passed(message(__name__, "04.1", "rank-0-held"))


def _tree_problem(events, results, inputs, world_size: int, nbytes: int) -> str | None:
    """The first thing wrong with a binomial reduce's messages or rank 0's result, or None."""
    sends = {rank: [e for e in events if e.src == rank] for rank in range(world_size)}
    if sends[0]:
        return (message(__name__, "04.1", "rank-0-sent", dst=sends[0][0].dst))
    for rank in range(1, world_size):
        mine, parent = sends[rank], _parent(rank)
        s = (rank & -rank).bit_length() - 1
        if not mine:
            return (message(__name__, "04.1", "never-sent", rank=rank, parent=parent, s=s))
        first = mine[0]
        if first.dst != parent:
            at = f" at step {first.step}" if first.step >= 0 else ""
            return (message(__name__, "04.1", "wrong-parent", rank=rank, dst=first.dst, at=at,
                            parent=parent, s=s))
        if len(mine) > 1:
            to = ", then ".join(str(e.dst) for e in mine)
            return (message(__name__, "04.1", "sent-many", rank=rank, count=len(mine),
                            to=to))
        if first.nbytes != nbytes:
            return (message(__name__, "04.1", "sent-part", rank=rank, nbytes=first.nbytes,
                            nbytes2=nbytes))
    got = results[0]
    if got is None:
        return message(__name__, "04.1", "rank-0-returned")
    got, expected = np.asarray(got), np.sum(inputs, axis=0)
    if got.shape != expected.shape:
        return (message(__name__, "04.1", "wrong-shape", shape=got.shape,
                        shape2=expected.shape))
    if np.array_equal(got, expected):
        return None
    ranks = _ranks_in(got.reshape(-1)[0], world_size) if got.size else None
    if ranks is not None and ranks != set(range(world_size)):
        missing = sorted(set(range(world_size)) - ranks)
        via = {_parent(m) for m in missing if _parent(m) != 0}
        why = (message(__name__, "04.1", "rank-min-received", min=min(via), min2=min(missing))
               if via else message(__name__, "04.1", "rank-0-must"))
        return message(__name__, "04.1", "rank-0-result", missing=missing, why=why)
    return (message(__name__, "04.1", "rank-0-holds", but=got.reshape(-1)[:3],
                    each=expected.reshape(-1)[:3]))


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
       values=lambda d: _step_values(d.world_size))


def _step_values(n: int) -> dict:
    log, p = (n - 1).bit_length(), 1 << (n.bit_length() - 1)  # ⌈log2 N⌉; the power of two below
    tree, rd = count_steps("tree", n), count_steps("recursive_doubling", n)
    return {"n": n, "log": log, "p": p, "ring_phase": n - 1, "ring": 2 * (n - 1), "pow": 1 << log,
            "extra": n - p, "tree": tree, "half": tree // 2, "rd": rd, "exchanges": rd - 2}


def _step_slips(n: int) -> list:
    log, p = (n - 1).bit_length(), 1 << (n.bit_length() - 1)
    return [Slip(log, "one-phase", "tree"), Slip(n - 1, "ring-phase", "tree"),
            Slip(2 * (n - 1), "ring", "tree"), Slip(2 * (log - 1), "round-up", "tree"),
            Slip(p.bit_length() - 1, "no-fold", "recursive_doubling"),
            Slip(log, "no-round-up", "recursive_doubling"),
            Slip(2 * log, "two-phases", "recursive_doubling"),
            Slip(2 * (p.bit_length() - 1), "two-phases", "recursive_doubling")]


choice("04.3", module=__name__)


def bytes_per_step(trace) -> dict[tuple[str, int], int]:
    """The largest message of each (phase, step): a step's cost in bytes when ranks send at once."""
    out: dict[tuple[str, int], int] = {}
    for e in trace.events:
        out[e.tag, e.step] = max(out.get((e.tag, e.step), 0), e.nbytes)
    return out
