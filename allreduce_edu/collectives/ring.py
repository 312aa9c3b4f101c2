"""Ring all-reduce: reduce-scatter, then all-gather, around a ring.
Introduced in lessons/03_ring_allreduce.

Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations" (2009).
Every rank sends 2(N-1) chunks of S/N bytes: 2(N-1)/N·S in all, whatever N is.
"""

from __future__ import annotations

import numpy as np

from .. import costmodel
from .registry import allreduce_algorithm, reduce_into


def reduce_scatter_ring(comm, pieces: list[np.ndarray], op: str = "sum", last=None) -> np.ndarray:
    """Reduce `pieces` (this rank's N chunks) around the ring: rank r ends with chunk r summed
    over all ranks.

    Reduces in place into `pieces`. `last(acc, incoming)`, if given, replaces the final reduction
    (the fused LayerNorm hooks in here) and its return value becomes the finished chunk.
    """
    n, r = comm.world_size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):
        # step s: send chunk (r - s - 1) % n right, reduce chunk (r - s - 2) % n from the left
        out, into = (r - step - 1) % n, (r - step - 2) % n
        incoming = comm.sendrecv(right, pieces[out], left, "reduce_scatter", step=step, chunk=out)
        if last is not None and step == n - 2:
            pieces[into] = last(pieces[into], incoming)
        else:
            reduce_into(pieces[into], incoming, op)
    return pieces[r]


def all_gather_ring(comm, pieces: list) -> list[np.ndarray]:
    """Pass finished chunks around the ring: rank r starts with pieces[r] and ends with all N."""
    n, r = comm.world_size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):
        # step s: forward chunk (r - s) % n right, receive chunk (r - s - 1) % n from the left
        out, into = (r - step) % n, (r - step - 1) % n
        pieces[into] = comm.sendrecv(right, pieces[out], left, "all_gather", step=step, chunk=out)
    return pieces


@allreduce_algorithm("ring", layout="ring", phases=("reduce_scatter", "all_gather"),
                     cost=costmodel.ring, link_cost=costmodel.ring_on_links, colour="#0072B2")
def allreduce_ring(comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """Ring all-reduce = reduce-scatter + all-gather; bandwidth-optimal, 2(N-1) latency steps."""
    pieces = np.array_split(x.reshape(-1).copy(), comm.world_size)  # N chunks, sizes differ by ≤ 1
    reduce_scatter_ring(comm, pieces, op)  # pieces[rank] now holds the reduction of chunk `rank`
    all_gather_ring(comm, pieces)  # every piece now holds its reduction
    return np.concatenate(pieces).reshape(x.shape)
