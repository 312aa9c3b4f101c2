"""Lesson 03's first question as data (03.0: follow a chunk round the ring); lesson03.py re-exports
its checker."""

from __future__ import annotations

from .spec import Blank, Slip, number

LESSON = "allreduce_edu.exercises.lesson03"  # where the notebook imports it from


check_owner_prediction = number(
    "03.0", "where chunk 2 is after 2 steps", module=LESSON, checker="check_owner_prediction",
    question=None,  # asked in the lesson's words, above the animation that answers it
    blanks=(Blank("my_holder", "which rank holds chunk 2 after 2 steps of reduce-scatter? (a "
                  "rank)", "1"),),
    inputs={"world_size": 4, "chunk": 2, "steps": 2}, exact=True,
    answer=lambda d: _path(d)[d.steps],
    slips=lambda d: [Slip(rank, _owner_slip(d, rank)) for rank in range(d.world_size)
                     if rank != _path(d)[d.steps]],
    otherwise=lambda d, name, got: f"there are {d.world_size} ranks, numbered 0 to "
                                   f"{d.world_size - 1}.",
    success=lambda d: _owner_success(d),
    todo="replace None with the rank (0 to 3) that holds chunk 2 after 2 steps of reduce-scatter, "
         "then run this cell again.",
    hints=("Chunk 2 starts its trip on the rank that sends it first: in the first step (step 0, as "
           "the trace counts it) rank r sends chunk (r − 1) % N.",
           "Follow chunk 2 one hop to the right per step, for 2 steps (steps 0 and 1: the slider "
           "at 'reduce-scatter step 1'); each hop adds the receiving rank's part."),
    solution="""Rank 1. In reduce-scatter step s (counting from 0, as the code does), rank r sends \
chunk (r - s - 1) % N
to the right. Chunk 2 starts on rank 3 (step 0: (3 - 0 - 1) % 4 = 2) and moves one hop per \
step, collecting
one rank's data per hop: after step 0 it is on rank 0 (the data of ranks 3 and 0), after \
step 1 on
rank 1 (ranks 3, 0 and 1). The last step takes it to rank 2, which adds its own part: after \
reduce-scatter
rank r owns finished chunk r.""")


def _path(d) -> list[int]:
    """path[h]: the rank that holds chunk d.chunk after h steps of reduce-scatter."""
    return [(d.chunk + 1 + hop) % d.world_size for hop in range(d.world_size)]


def _owner_success(d) -> str:
    path, n, steps, chunk = _path(d), d.world_size, d.steps, d.chunk
    rest = (f" It goes on to rank {chunk}, which adds the last part: after reduce-scatter rank r "
            f"owns finished chunk r." if steps < n - 1 else
            " After reduce-scatter rank r owns finished chunk r.")
    return (f"rank {path[steps]}: chunk {chunk} starts on rank {path[0]} and travels "
            f"{' → '.join(map(str, path[:steps + 1]))}, picking up one rank's data per hop: after "
            f"{_count(steps, 'step')} it holds the data of {steps + 1} ranks.{rest}")


def _owner_slip(d, rank: int) -> str:
    path, n, steps, chunk = _path(d), d.world_size, d.steps, d.chunk
    hop = path.index(rank)
    if hop == 0:
        return (f"rank {rank} is where chunk {chunk} starts (in the first step rank r sends chunk "
                f"(r − 1) % N, and ({rank} − 1) % {n} = {chunk}). Follow it one hop to the right "
                f"per step, for {_count(steps, 'step')}.")
    if hop < steps:
        return (f"rank {rank} holds chunk {chunk} after {_count(hop, 'step')}, with the data of "
                f"{hop + 1} ranks; follow it {_count(steps - hop, 'more hop')} to the right.")
    if hop == n - 1:
        return (f"rank {rank} owns chunk {chunk} at the end of reduce-scatter, after all N − 1 = "
                f"{n - 1} steps; after {_count(steps, 'step')} the chunk is still "
                f"{_count(n - 1 - steps, 'hop')} short of it.")
    return (f"chunk {chunk} reaches rank {rank} only after {_count(hop, 'step')}: count the hops "
            f"again, one per step from rank {path[0]}.")


def _count(k: int, thing: str) -> str:
    return f"{k} {thing}{'' if k == 1 else 's'}"
