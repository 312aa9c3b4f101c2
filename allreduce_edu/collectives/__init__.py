"""Collectives over any Communicator: one algorithm per module, chosen by name.

    allreduce(comm, x, op="sum", algorithm="ring")  # naive, all_to_all, ring, tree,
                                                    # recursive_doubling, rabenseifner, ...
    reduce(comm, x, op="sum", root=0)               # binomial tree; result on root, None elsewhere
    broadcast(comm, x, root=0)                      # binomial tree; root's x on every rank
    reduce_scatter(comm, x, op="sum", algorithm="ring")  # or "bruck";
                                                    # rank r gets np.array_split(x, N)[r]
    all_gather(comm, x, algorithm="ring")           # or "bruck"; pieces joined along axis 0
    iallreduce, ireduce_scatter, iall_gather        # non-blocking: a request now, .wait() later
    double_binary_tree.double_binary_tree(comm, x, op, chunks=K)  # NCCL's trees, K chunks per tree
    available(comm)                                 # the algorithms comm can run (one_shot and
                                                    # two_shot need symmetric windows: comm.window)
"""

from __future__ import annotations

# importing blocking registers each algorithm; ALGORITHMS keeps its order (the lessons' order)
from .blocking import (
    ALL_GATHERS,
    OPS,
    REDUCE_SCATTERS,
    all_gather,
    allreduce,
    broadcast,
    reduce,
    reduce_scatter,
)
from .nonblocking import CollectiveRequest, iall_gather, iallreduce, ireduce_scatter, wait_all
from .registry import ALGORITHMS, DESCRIPTIONS, available, describe, runs_on

__all__ = ["allreduce", "reduce", "broadcast", "reduce_scatter", "all_gather", "ALGORITHMS",
           "DESCRIPTIONS", "describe", "OPS", "iallreduce", "ireduce_scatter", "iall_gather",
           "wait_all", "CollectiveRequest", "REDUCE_SCATTERS", "ALL_GATHERS", "available",
           "runs_on"]
