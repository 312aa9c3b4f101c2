"""Lesson 04 · tree all-reduce: write a binomial reduce, predict step counts, explain the size crossover."""

from __future__ import annotations

import numpy as np

from ..runtime import Cluster
from ..collectives import allreduce
from .feedback import Feedback, failed, multiple_choice, passed  # noqa: F401
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - for the notebook

SOLUTIONS: dict[str, str] = {}  # TODO(issue 10): move into @exercise registrations

SOLUTIONS["04.1"] = """def my_tree_reduce(comm, x):
    acc = np.array(x, copy=True)
    distance = 1
    while distance < comm.world_size:
        if comm.rank & distance:                      # bit s set: send my partial to rank - 2^s, done
            comm.send(comm.rank - distance, acc, "reduce")
            return None
        if comm.rank + distance < comm.world_size:    # else add what rank + 2^s sends (if it exists)
            acc += comm.recv(comm.rank + distance, "reduce")
        distance *= 2
    return acc                                        # only rank 0 gets here"""

SOLUTIONS["04.2"] = """Tree: reduce then broadcast, ⌈log2 13⌉ = 4 steps each: 8 steps in all.
Recursive doubling: 13 is not a power of two, so the 13 - 8 = 5 extra ranks fold into partners first
(1 step), the 8 left exchange for log2 8 = 3 steps, and the result is unfolded back (1 step): 5 steps.
Check: cluster.trace.steps() after allreduce(..., algorithm=...) on a Cluster(13, transport="local")."""

SOLUTIONS["04.3"] = """a: a step costs about α + (bytes in the step)·β. At 8 bytes only α matters, and the tree takes
2⌈log2 N⌉ steps against the ring's 2(N-1). At 64 MiB the bytes matter: every tree step moves the whole
buffer S, 2⌈log2 N⌉·S along the way, while the ring moves S/N per step, 2(N-1)/N·S in all."""


def _run_on_rank(comm, fn, inputs):
    """Call the learner's fn(comm, x) with this rank's input."""
    return fn(comm, inputs[comm.rank].copy())


def _inputs(world_size: int, length: int) -> list[np.ndarray]:
    """Rank r contributes 2^r · (1, 2, 3, 4, 5, 1, ...): element 0 of any sum names the ranks in it."""
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
        return " A rank asked for a partner outside the world: receive from rank + 2^s only when it is < world_size."
    if "deadline" in text or "Timeout" in type(e).__name__:
        return (" Some rank waited for a message that never came: each rank with bit s set sends once to "
                "rank - 2^s and stops; the others receive from rank + 2^s (when it exists) before moving on.")
    return ""


def check_tree_reduce(fn, worlds=((3, 7), (4, 1), (5, 100_003))) -> Feedback:
    """Exercise 04.1: `fn(comm, x)` reduces (sums) x to rank 0 along a binomial tree; on real gRPC ranks."""
    for world_size, length in worlds:
        inputs = _inputs(world_size, length)
        nbytes = inputs[0].nbytes
        with Cluster(world_size, timeout=5) as cluster:
            try:
                results = cluster.run(_run_on_rank, fn, inputs)
            except Exception as e:  # noqa: BLE001 - the learner's code: report, don't crash
                return failed(f"on {world_size} ranks your function raised {type(e).__name__}: {e}.{_why_failed(e)}")
            events = list(cluster.trace.events)
        where = f"on {world_size} ranks"
        sends = {rank: [e for e in events if e.src == rank] for rank in range(world_size)}
        if sends[0]:
            return failed(f"{where} rank 0 sent to rank {sends[0][0].dst}: rank 0 is the root of the reduce, it only "
                          f"receives.")
        for rank in range(1, world_size):
            mine, parent = sends[rank], _parent(rank)
            s = (rank & -rank).bit_length() - 1
            if not mine:
                return failed(f"{where} rank {rank} never sent its partial sum: in a binomial tree rank {rank} sends "
                              f"to rank {parent} ({rank} − 2^{s}), at step {s}.")
            first = mine[0]
            if first.dst != parent:
                at = f" at step {first.step}" if first.step >= 0 else ""
                return failed(f"{where} rank {rank} sent to rank {first.dst}{at}, but in a binomial tree rank {rank} "
                              f"sends to rank {parent} ({rank} − 2^{s}): the lowest set bit of {rank} is 2^{s}.")
            if len(mine) > 1:
                to = ", then ".join(str(e.dst) for e in mine)
                return failed(f"{where} rank {rank} sent {len(mine)} messages (to {to}): in a binomial tree each rank "
                              f"sends its partial once and is then done — stop (break/return) after the send.")
            if first.nbytes != nbytes:
                return failed(f"{where} rank {rank} sent {first.nbytes} bytes, but its partial sum is the whole buffer "
                              f"({nbytes} bytes): every tree step moves all of it.")
        got = results[0]
        if got is None:
            return failed(f"{where} rank 0 returned None: return the reduced array on rank 0.")
        got, expected = np.asarray(got), np.sum(inputs, axis=0)
        if got.shape != expected.shape:
            return failed(f"{where} rank 0 returned shape {got.shape}; the reduce keeps the input's shape "
                          f"{expected.shape}.")
        if not np.array_equal(got, expected):
            ranks = _ranks_in(got.reshape(-1)[0], world_size) if got.size else None
            if ranks is not None and ranks != set(range(world_size)):
                missing = sorted(set(range(world_size)) - ranks)
                via = {_parent(m) for m in missing if _parent(m) != 0}
                hint = (f" rank {min(via)} received from rank {min(missing)} but forwarded less: add what you "
                        f"receive into your partial before you send it on." if via else
                        " rank 0 must add every message it receives.")
                return failed(f"{where} rank 0's result is missing the data of rank(s) {missing}.{hint}")
            return failed(f"{where} rank 0 holds {got.reshape(-1)[:3]}…, but the sum over ranks starts "
                          f"{expected.reshape(-1)[:3]}…: each rank adds what it receives to its own x.")
    return passed("rank 0 held the exact sum on 3, 4 and 5 gRPC ranks; every other rank sent once, to "
                  "rank − (its lowest set bit): ⌈log2 N⌉ steps.")


def trace_of(algorithm: str, world_size: int, count: int = 1024, dtype="float32"):
    """The trace of one all-reduce of `count` elements per rank, on a local (thread) cluster: instant."""
    with Cluster(world_size, transport="local") as cluster:
        cluster.run(lambda comm: allreduce(comm, np.ones(count, dtype), algorithm=algorithm))
        return cluster.trace


def step_summary(trace) -> str:
    """One line per phase: `reduce     | step 0: 1→0 3→2 | step 1: 2→0`, who sends to whom in each step."""
    phases: dict[str, dict[int, list[str]]] = {}
    for e in sorted(trace.events, key=lambda e: (e.step, e.src)):
        phases.setdefault(e.tag, {}).setdefault(e.step, []).append(f"{e.src}→{e.dst}")
    order = list(trace.steps())
    return "\n".join(f"{tag:<14} | " + " | ".join(f"step {s}: {' '.join(sends)}" for s, sends in sorted(steps.items()))
                     for tag, steps in sorted(phases.items(), key=lambda item: order.index(item[0])))


def count_steps(algorithm: str, world_size: int) -> int:
    """Total steps (all phases) of one all-reduce, read from a local trace."""
    return sum(trace_of(algorithm, world_size, count=world_size).steps().values())


def check_step_prediction(tree: int, recursive_doubling: int, world_size: int = 13) -> Feedback:
    """Exercise 04.2: total steps of a tree and of a recursive-doubling all-reduce on `world_size` ranks."""
    want_tree, want_rd = count_steps("tree", world_size), count_steps("recursive_doubling", world_size)
    log = (world_size - 1).bit_length()  # ⌈log2 N⌉
    p = 1 << (world_size.bit_length() - 1)
    if tree != want_tree:
        if tree == log:
            return failed(f"{log} is one phase: the tree all-reduce is a reduce and then a broadcast, "
                          f"⌈log2 {world_size}⌉ steps each.")
        if tree in (world_size - 1, 2 * (world_size - 1)):
            return failed(f"{tree} is the ring's count (N − 1 per phase); the tree's depth is ⌈log2 N⌉.")
        if tree == 2 * (log - 1):
            return failed(f"log2 {world_size} is not a whole number: round it up — {world_size} ranks need a tree "
                          f"of depth {log}, as {1 << log} would.")
        return failed("the tree needs ⌈log2 N⌉ steps per phase, and it has two phases (reduce, broadcast).")
    if recursive_doubling != want_rd:
        if recursive_doubling == p.bit_length() - 1:
            return failed(f"{recursive_doubling} counts the exchanges among the {p} ranks left after folding; "
                          f"{world_size} is not a power of two, so add the fold and the unfold steps.")
        if recursive_doubling == log:
            return failed(f"recursive doubling does not round up: it folds the {world_size - p} extra ranks into "
                          f"partners (a step), exchanges among {p} (log2 {p} steps), then unfolds (a step).")
        if recursive_doubling == 2 * log or recursive_doubling == 2 * (p.bit_length() - 1):
            return failed("recursive doubling has one exchange phase, not two: each step both reduces and "
                          "spreads the result.")
        return failed(f"count fold (1) + exchanges among p = {p} ranks (log2 p) + unfold (1).")
    return passed(f"tree: {want_tree} steps ({want_tree // 2} reduce + {want_tree // 2} broadcast); recursive "
                  f"doubling: {want_rd} (fold, {want_rd - 2} exchanges, unfold) — the ring would take "
                  f"{2 * (world_size - 1)}.")


def check_crossover_answer(choice: str) -> Feedback:
    """Exercise 04.3: why does the tree beat the ring at 8 bytes but lose at 64 MiB? (a, b, c or d)"""
    answers = {
        "a": "",
        "b": "no: nothing is compressed here, and the tree sends the same number of messages at every size. "
             "Count the bytes in each step instead.",
        "c": "no: the additions are the same work in both (each element is added N − 1 times), and NumPy adds "
             "64 MiB in milliseconds. The bytes on the wire are what differ.",
        "d": "no: at 8 bytes the ring's N − 1 steps are all latency (α) — more steps means slower, not more "
             "parallel. Compare the step counts and the bytes per step.",
    }
    success = ("small messages are priced by α per step (the tree has fewer steps); large ones by bytes per "
               "step (the tree moves the whole buffer every step, the ring a 1/N chunk).")
    return multiple_choice(choice, answers, right="a", success=success)


def bytes_per_step(trace) -> dict[tuple[str, int], int]:
    """The largest message of each (phase, step): what one step costs in bytes when the ranks send in parallel."""
    out: dict[tuple[str, int], int] = {}
    for e in trace.events:
        out[e.tag, e.step] = max(out.get((e.tag, e.step), 0), e.nbytes)
    return out
