"""Ring all-reduce: reduce-scatter, then all-gather, around a ring.
Introduced in lessons/03_ring_allreduce.

Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations" (2009).
Every rank sends 2(N-1) chunks of S/N bytes: 2(N-1)/N·S in all, whatever N is.
"""

from __future__ import annotations

import numpy as np

from ..model import costmodel
from ..ops import OPS
from .registry import allreduce_algorithm


def reduce_scatter_ring(comm, pieces: list[np.ndarray], op: str = "sum", last=None,
                        out: list[np.ndarray] | None = None) -> np.ndarray:
    """Reduce `pieces` (this rank's N chunks) around the ring: rank r ends with chunk r summed
    over all ranks.

    Reduces in place into `pieces`, or, given `out` (N chunks of the result), into `out`, leaving
    `pieces` as they were. `last(acc, incoming)`, if given, replaces the final reduction
    (the fused LayerNorm hooks in here) and its return value becomes the finished chunk.
    """
    n, r = comm.world_size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    out = pieces if out is None else out
    reduced = pieces[(r - 1) % n]  # what step 0 sends: this rank's own chunk
    for step in range(n - 1):
        # step s: send chunk (r - s - 1) % n right, reduce chunk (r - s - 2) % n from the left
        send, into = (r - step - 1) % n, (r - step - 2) % n
        incoming = comm.sendrecv(right, reduced, left, "reduce_scatter", step=step, chunk=send)
        if last is not None and step == n - 2:
            out[into] = reduced = last(pieces[into], incoming)
            continue
        # each chunk is reduced once per rank; all but the last go right at the next step, so
        # they are reduced straight into the send buffer (shm: the segment the next step sends)
        reduced = (out[into] if step == n - 2 or out is pieces
                   else comm.send_buffer(right, pieces[into].shape, pieces[into].dtype))
        OPS[op](pieces[into], incoming, out=reduced)
    if n == 1 and out is not pieces:
        out[r][...] = pieces[r]
    return out[r]


def all_gather_ring(comm, pieces: list, copy_into: bool = False) -> list[np.ndarray]:
    """Pass finished chunks around the ring: rank r starts with pieces[r] and ends with all N.

    Each received chunk replaces its entry in `pieces`, or, with `copy_into`, is copied into it
    (pieces that are views of one result array fill that array, with no concatenate after).
    """
    n, r = comm.world_size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):
        # step s: forward chunk (r - s) % n right, receive chunk (r - s - 1) % n from the left
        send, into = (r - step) % n, (r - step - 1) % n
        incoming = comm.sendrecv(right, pieces[send], left, "all_gather", step=step, chunk=send)
        if copy_into:
            pieces[into][...] = incoming
        else:
            pieces[into] = incoming
    return pieces


@allreduce_algorithm("ring", layout="ring", phases=("reduce_scatter", "all_gather"),
                     cost=costmodel.ring, link_cost=costmodel.ring_on_links, colour="#0072B2")
def allreduce_ring(comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """Ring all-reduce = reduce-scatter + all-gather; bandwidth-optimal, 2(N-1) latency steps.

    Memory passes count like bytes on the wire: the input is read once, where its chunks are first
    sent or reduced, and the result written once, chunk by chunk (no copy of x, no concatenate).
    """
    out = np.empty_like(x)
    mine = np.array_split(x.reshape(-1), comm.world_size)  # N chunks, sizes differ by ≤ 1
    result = np.array_split(out.reshape(-1), comm.world_size)  # views of the result
    reduce_scatter_ring(comm, mine, op, out=result)  # result[rank] now holds chunk `rank` reduced
    all_gather_ring(comm, result, copy_into=True)  # and every other chunk arrives into the result
    return out
