"""Every all-reduce algorithm described once, where it is registered;
the checks every collective makes.

    @allreduce_algorithm("ring", layout="ring", phases=("reduce_scatter", "all_gather"),
                         cost=costmodel.ring)
    def allreduce_ring(comm, x, op="sum"): ...

The description says how the animation lays ranks out, how the algorithm cuts a buffer into chunks,
the order of its phases, its α-β-γ cost formula and its colour in plots; replay, viz, costmodel and
bench read it from here, so a new algorithm is one module and nothing else.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..comm.base import check_array
from ..comm.window import TRANSPORTS as WINDOW_TRANSPORTS
from ..model import costmodel
from ..ops import OPS, check_op

# ranks on a ring, around rank 0, by bit count, as a cube, two trees in two colours, on a circle
LAYOUTS = ("ring", "star", "tree", "hypercube", "double_tree", "circle")


def split_bounds(size: int, chunks: int) -> np.ndarray:
    """Chunk edges as np.array_split cuts a flat buffer (ring.py): sizes differ by at most one,
    the first size % chunks chunks the longer."""
    q, extra = divmod(size, chunks)
    return np.array([i * q + min(i, extra) for i in range(chunks + 1)])


def block_bounds(size: int, chunks: int) -> np.ndarray:
    """Chunk edges as np.linspace cuts it (recursive.py's blocks for recursive halving)."""
    return np.linspace(0, size, chunks + 1).astype(int)


@dataclass(frozen=True)
class Algorithm:
    """What the rest of the package knows about one all-reduce algorithm."""

    name: str
    run: Callable  # run(comm, x, op="sum") -> the reduced array, on every rank
    layout: str = "ring"  # one of LAYOUTS: how an animation places the ranks
    phases: tuple[str, ...] = ()  # the message tags of its phases, in the order they run
    bounds: Callable[[int, int], np.ndarray] = split_bounds  # (size, chunks) -> chunk edges
    cost: Callable | None = None  # (world_size, nbytes, alpha, beta, gamma=0) -> seconds
    link_cost: Callable | None = None  # (world_size, nbytes, links) -> seconds on two-level links
    colour: str = "#999999"  # the same in every plot
    summary: str = ""  # one line, from the function's docstring
    needs: str = ""  # what a communicator must offer besides messages: "windows" (comm.window)


# name -> run(comm, x, op), in registration order (the lessons' order)
ALGORITHMS: dict[str, Callable] = {}
DESCRIPTIONS: dict[str, Algorithm] = {}  # name -> its description


def describe(name: str) -> Algorithm | None:
    """The description of `name`, or of the algorithm in a trace's collective name
    ("allreduce/ring")."""
    return DESCRIPTIONS.get(name) or DESCRIPTIONS.get(name.rpartition("/")[2])


def check_root(comm, root) -> int:
    if not isinstance(root, (int, np.integer)) or not 0 <= root < comm.world_size:
        raise ValueError(f"rank {comm.rank}: root={root!r} is outside the world: valid roots are "
                         f"0..{comm.world_size - 1}")
    return int(root)


def reduce_into(acc: np.ndarray, x: np.ndarray, op: str) -> np.ndarray:
    """acc = op(acc, x), elementwise, in place."""
    return OPS[op](acc, x, out=acc)


def allreduce_algorithm(name: str, *, layout: str = "ring", phases: tuple[str, ...] = (),
                        bounds=split_bounds, cost=None, link_cost=None, colour: str = "#999999",
                        needs: str = ""):
    """Register `body(comm, x, op)` as all-reduce algorithm `name`, described by the keywords.

    The wrapper validates `op`, makes `x` a contiguous array of a wire dtype (lists convert as
    `np.asarray` does), and marks the messages inside as one collective so ranks that call it
    differently fail with CollectiveMismatch. The body never sees (or changes) the caller's array.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"algorithm {name!r}: layout must be one of {', '.join(LAYOUTS)}, "
                         f"got {layout!r}")

    def register(body):
        @functools.wraps(body)
        def allreduce_with(comm, x, op: str = "sum") -> np.ndarray:
            check_op(op, comm.rank)
            x = check_array(x, f"allreduce input on rank {comm.rank}")
            with comm.collective("allreduce", algorithm=name, op=op, dtype=x.dtype, shape=x.shape):
                return body(comm, x, op)
        summary = (body.__doc__ or "").strip().split("\n")[0]
        DESCRIPTIONS[name] = Algorithm(name, allreduce_with, layout, tuple(phases), bounds, cost,
                                       link_cost, colour, summary, needs)
        ALGORITHMS[name] = allreduce_with
        costmodel.register(name, cost, link_cost, needs)
        return allreduce_with
    return register


def runs_on(name: str, comm) -> bool:
    """Whether algorithm `name` can run on `comm` (one that needs windows needs `open_window`:
    the thread transport, shm; gRPC's communicator refuses when it opens one)."""
    return DESCRIPTIONS[name].needs != "windows" or (
        hasattr(comm, "open_window") and getattr(comm, "transport", "") in WINDOW_TRANSPORTS)


def available(comm) -> list[str]:
    """The algorithms that run on `comm`, in registration order."""
    return [name for name in ALGORITHMS if runs_on(name, comm)]


def unregister(name: str) -> None:
    """Forget algorithm `name` (a test's toy algorithm, say)."""
    ALGORITHMS.pop(name, None)
    DESCRIPTIONS.pop(name, None)
    costmodel.register(name, None, None)
