"""The blocking collectives over any communicator (comm.contract.Comm), each one call:
allreduce by name, reduce, broadcast, reduce_scatter and all_gather (ring or Bruck's).
Introduced in lessons/02-04 and 16."""

from __future__ import annotations

import numpy as np

from ..comm.base import check_array

# importing registers each algorithm; ALGORITHMS keeps this order (the lessons' order)
# isort: off
from .naive import allreduce_naive  # noqa: F401 - registers naive and all_to_all
from .ring import all_gather_ring, reduce_scatter_ring_into
from .tree import broadcast_tree, reduce_tree
from .recursive import allreduce_rabenseifner  # noqa: F401 - and recursive_doubling
from .hierarchical import hierarchical  # noqa: F401 - needs ring; nodes from model.links (lessons/05)
from .double_binary_tree import double_binary_tree  # noqa: F401 - NCCL's two trees (lessons/16)
from .bruck import all_gatherv_bruck, reduce_scatter_bruck
from .symmetric import allreduce_one_shot  # noqa: F401 - and two_shot: on windows (lessons/18)
# isort: on
from ..ops import OPS, check_op
from .registry import ALGORITHMS, check_root

__all__ = ["allreduce", "reduce", "broadcast", "reduce_scatter", "all_gather", "OPS",
           "REDUCE_SCATTERS", "ALL_GATHERS"]


def _reduce_scatter_ring(comm, pieces: list[np.ndarray], op: str) -> np.ndarray:
    out = [None] * comm.world_size
    out[comm.rank] = np.empty_like(pieces[comm.rank])  # the only piece this rank keeps
    return reduce_scatter_ring_into(comm, pieces, out, op)


def _all_gather_ring(comm, x: np.ndarray) -> np.ndarray:
    pieces = [None] * comm.world_size
    pieces[comm.rank] = x
    return np.concatenate(all_gather_ring(comm, pieces), axis=0)


# name -> (comm, this rank's N pieces, op) -> its reduced piece; the formulas in costmodel
REDUCE_SCATTERS = {"ring": _reduce_scatter_ring, "bruck": reduce_scatter_bruck}
# name -> (comm, x) -> every rank's x joined along axis 0 (lengths may differ)
ALL_GATHERS = {"ring": _all_gather_ring, "bruck": all_gatherv_bruck}


def _check_algorithm(comm, algorithm: str, table: dict, what: str) -> None:
    if algorithm not in table:
        raise ValueError(f"rank {comm.rank}: unknown {what} algorithm {algorithm!r}; valid "
                         f"algorithms: {', '.join(table)}")


def allreduce(comm, x, op: str = "sum", algorithm: str = "ring") -> np.ndarray:
    """Every rank gets op(x over all ranks), with x's shape and dtype;
    the caller's x is never changed."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"rank {comm.rank}: unknown algorithm {algorithm!r}; valid algorithms: "
                         f"{', '.join(ALGORITHMS)}")
    return ALGORITHMS[algorithm](comm, x, op)


def reduce(comm, x, op: str = "sum", root: int = 0) -> np.ndarray | None:
    """Binomial-tree reduce: `root` gets op(x over all ranks); the other ranks get None
    (as in mpi4py)."""
    check_op(op, comm.rank)
    root = check_root(comm, root)
    x = check_array(x, f"reduce input on rank {comm.rank}")
    with comm.collective("reduce", algorithm="tree", op=op, dtype=x.dtype, shape=x.shape,
                         root=root):
        result = reduce_tree(comm, x, op, root)
    return result if comm.rank == root else None


def broadcast(comm, x, root: int = 0) -> np.ndarray:
    """Binomial-tree broadcast: every rank gets a copy of root's x
    (all ranks pass arrays of one shape)."""
    root = check_root(comm, root)
    x = check_array(x, f"broadcast input on rank {comm.rank}")
    with comm.collective("broadcast", algorithm="tree", dtype=x.dtype, shape=x.shape, root=root):
        return broadcast_tree(comm, x, root)


def reduce_scatter(comm, x, op: str = "sum", algorithm: str = "ring") -> np.ndarray:
    """Reduce-scatter (ring, or Bruck's in ⌈log2 N⌉ steps): rank r gets the reduction of piece r of
    np.array_split(x, world_size, axis=0)."""
    check_op(op, comm.rank)
    _check_algorithm(comm, algorithm, REDUCE_SCATTERS, "reduce_scatter")
    x = check_array(x, f"reduce_scatter input on rank {comm.rank}")
    if x.ndim == 0:
        raise ValueError(f"reduce_scatter on rank {comm.rank} needs an array with at least one "
                         f"axis to split")
    with comm.collective("reduce_scatter", algorithm=algorithm, op=op, dtype=x.dtype,
                         shape=x.shape):
        mine = np.array_split(x, comm.world_size, axis=0)  # views of x, never written
        return REDUCE_SCATTERS[algorithm](comm, mine, op)


def all_gather(comm, x, algorithm: str = "ring") -> np.ndarray:
    """All-gather (ring, or Bruck's in ⌈log2 N⌉ steps): every rank's x concatenated along axis 0
    in rank order (lengths may differ)."""
    _check_algorithm(comm, algorithm, ALL_GATHERS, "all_gather")
    x = np.atleast_1d(check_array(x, f"all_gather input on rank {comm.rank}"))
    with comm.collective("all_gather", algorithm=algorithm, dtype=x.dtype, shape=x.shape[1:]):
        return ALL_GATHERS[algorithm](comm, x)
