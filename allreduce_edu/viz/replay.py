"""Replay a trace: which ranks' data every chunk of every rank holds after each step.
Introduced in lessons/03.

Every message means "the receiver combines what it held for those chunks with what the sender held
when it sent them". A set of contributing ranks per (rank, chunk) is therefore exactly what crossed
the wire; the animation widgets in `allreduce_edu.viz` draw these states and nothing else.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from ..collectives.registry import DESCRIPTIONS, describe, split_bounds
from ..ops import OPS, check_op
from ..trace import Trace


@dataclass(frozen=True)
class State:
    """The buffers after one step:
    held[rank][chunk] is the frozenset of ranks whose data that chunk contains."""

    index: int  # 0 = the initial state, before any message
    phase: str  # the tag of this step's messages ("" for the initial state)
    step: int  # step within the phase
    phase_steps: int  # number of steps in the phase
    held: tuple[tuple[frozenset[int], ...], ...]  # (world_size, chunks)
    messages: tuple = ()  # the trace's Events of this step, in send order
    sent: tuple[int, ...] = ()  # bytes each rank has sent so far, this step included
    # values[rank][chunk]: the chunk's numbers, if asked
    values: tuple | None = field(default=None, compare=False)

    @property
    def caption(self) -> str:
        """'reduce-scatter, step 1 (steps 0–2)': the step as the code and the trace count it (the
        loop's `step`, the Event's `step`), with the phase's range so the end is plain."""
        if not self.phase:
            return "start: every rank holds only its own data"
        return (f"{self.phase.replace('_', '-')}, step {self.step} "
                f"(steps 0–{self.phase_steps - 1})")


def replay(trace, world_size: int | None = None, chunks: int | None = None, *, values=None,
           op: str = "sum", collective: str | None = None) -> list[State]:
    """One State per step of `trace` (state 0 = initial: rank r's chunk c holds {r}).

    chunks: how many chunks a buffer is cut into
    (default: the highest chunk index any message names, or 1).
    values: each rank's initial array; then every state also carries each chunk's real numbers,
    computed as op over the initial data of the ranks in its set
    (chunks as the algorithm cuts them).
    collective: keep only the messages of this collective (needed when a trace holds several).
    """
    events = _one_collective(list(trace.events if isinstance(trace, Trace) else trace), collective)
    if world_size is None:
        world_size = 1 + max((max(e.src, e.dst) for e in events), default=0)
    if chunks is None:
        chunks = max((e.chunk[1] for e in events if e.chunk is not None), default=1)
    for e in events:
        if (max(e.src, e.dst) >= world_size
                or (e.chunk is not None and not (-chunks <= e.chunk[0] < e.chunk[1] <= chunks
                                                 and e.chunk[1] - e.chunk[0] <= chunks))):
            raise ValueError(f"message {e} does not fit a world of {world_size} ranks with "
                             f"{chunks} chunks; pass the world_size and chunks the run used")
    pieces = (_initial_pieces(values, world_size, chunks, _name(events), op)
              if values is not None else None)

    held = [[frozenset({r})] * chunks for r in range(world_size)]
    sent = [0] * world_size
    states = [State(0, "", 0, 0, _freeze(held), (), tuple(sent), _values(held, pieces, op))]
    steps = _steps(events)
    for phase, step in sorted(steps, key=_step_order(events, _name(events))):
        messages = steps[phase, step]
        # every message of a step carries what its sender held when the step began
        before = _freeze(held)
        for e in messages:
            # lo < 0: a run of chunks that wraps past the last one (Bruck's)
            covered = range(chunks) if e.chunk is None else [c % chunks for c in range(*e.chunk)]
            for c in covered:
                held[e.dst][c] = held[e.dst][c] | before[e.src][c]
            sent[e.src] += e.nbytes
        phase_steps = 1 + max(s for p, s in steps if p == phase)
        states.append(State(len(states), phase, step, phase_steps, _freeze(held), tuple(messages),
                            tuple(sent), _values(held, pieces, op)))
    return states


def _one_collective(events: list, collective: str | None) -> list:
    """The events of `collective`;
    refuse a trace that mixes collectives or repeats one (its replay would lie)."""
    if collective is not None:
        events = [e for e in events if e.collective == collective]
    names = sorted({e.collective for e in events})
    if len(names) > 1:
        raise ValueError(f"this trace holds messages of {len(names)} collectives "
                         f"({', '.join(map(repr, names))}); pass collective= one of them")
    seen = set()
    for e in events:
        key = (e.src, e.dst, e.tag, e.step, e.chunk)
        if e.step >= 0 and key in seen:
            raise ValueError(f"message '{e}' appears twice: the trace holds more than one call of "
                             f"{e.collective or 'this algorithm'}; "
                             f"run one collective per cluster.run to replay it")
        seen.add(key)
    return events


def _name(events: list) -> str:
    return events[0].collective if events else ""


def _steps(events: list) -> dict[tuple[str, int], list]:
    steps = defaultdict(list)
    for e in events:
        steps[e.tag, e.step].append(e)
    return steps


def _step_order(events: list, collective: str):
    """Sort key for (phase, step): in the order the algorithm's description gives its phases
    (a folded rank may race ahead in time), or an algorithm whose phases these are;
    else by first appearance in time."""
    first = {}
    for e in sorted(events, key=lambda e: e.t_start):
        first.setdefault(e.tag, len(first))
    described = [describe(collective)] if describe(collective) else list(DESCRIPTIONS.values())
    # unnamed: any that fits
    fits = [a.phases for a in described if a and all(tag in a.phases for tag in first)]
    order = fits[0] if fits else tuple(first)
    return lambda key: (order.index(key[0]), key[1])


def _freeze(held) -> tuple[tuple[frozenset[int], ...], ...]:
    return tuple(tuple(row) for row in held)


def chunk_bounds(size: int, chunks: int, collective: str = "") -> np.ndarray:
    """Where each chunk starts and ends in a flat buffer of `size`, as the algorithm cuts it."""
    algorithm = describe(collective)
    return (algorithm.bounds if algorithm else split_bounds)(size, chunks)


def _initial_pieces(values, world_size: int, chunks: int, collective: str,
                    op: str) -> list[list[np.ndarray]]:
    check_op(op)
    if len(values) != world_size:
        raise ValueError(f"values has {len(values)} arrays; "
                         f"pass one initial array per rank ({world_size})")
    flats = [np.asarray(v).reshape(-1) for v in values]
    bounds = chunk_bounds(flats[0].size, chunks, collective)
    return [[flat[bounds[c]:bounds[c + 1]] for c in range(chunks)] for flat in flats]


def _values(held, pieces, op: str):
    """values[rank][chunk] = op over the initial chunk data of the ranks in held[rank][chunk]."""
    if pieces is None:
        return None
    def combine(ranks, c):
        out = pieces[min(ranks)][c].copy()
        for r in sorted(ranks)[1:]:
            out = OPS[op](out, pieces[r][c])
        return out

    return tuple(tuple(combine(ranks, c) for c, ranks in enumerate(row)) for row in held)
