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


def reduce_scatter_ring(comm, pieces: list[np.ndarray], op: str = "sum",
                        last=None) -> np.ndarray:
    """Reduce `pieces` (this rank's N chunks) in place around the ring: rank r ends with chunk r
    reduced over all ranks, and returns it. `last(acc, incoming)`, if given, does the final
    reduction instead, and its return value becomes the finished chunk (lesson 07 hooks in here).
    """
    n, r = comm.world_size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):
        # step s: send chunk (r - s - 1) % n right, reduce chunk (r - s - 2) % n from the left
        send, into = (r - step - 1) % n, (r - step - 2) % n
        incoming = comm.sendrecv(right, pieces[send], left, "reduce_scatter", step=step, chunk=send)
        if last is not None and step == n - 2:
            pieces[into] = last(pieces[into], incoming)
        else:
            OPS[op](pieces[into], incoming, out=pieces[into])
    return pieces[r]


def reduce_scatter_ring_into(comm, pieces: list[np.ndarray], out: list, op: str = "sum",
                             last=None) -> np.ndarray:
    """`reduce_scatter_ring` as the library's all-reduce, the fused operator and the tensor-parallel
    norm run it: `pieces` stay as they were, the finished chunk r lands in `out[r]` (a view of the
    result), and each chunk that goes on around the ring is reduced straight into the buffer it
    is sent from (`comm.send_buffer`: on shm, the segment the next step sends, uncopied). Every
    input byte is read once and the result written once, as on the wire."""
    n, r = comm.world_size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    reduced = pieces[(r - 1) % n]  # what step 0 sends: this rank's own chunk
    for step in range(n - 1):
        # step s: send chunk (r - s - 1) % n right, reduce chunk (r - s - 2) % n from the left
        send, into = (r - step - 1) % n, (r - step - 2) % n
        incoming = comm.sendrecv(right, reduced, left, "reduce_scatter", step=step, chunk=send)
        if step == n - 2 and last is not None:  # the last step: chunk r, finished by `last`
            out[into] = last(pieces[into], incoming)
        elif step == n - 2:  # the last step: chunk r, reduced into the result
            OPS[op](pieces[into], incoming, out=out[into])
        else:  # a chunk that goes right at the next step: reduced into what will be sent
            reduced = comm.send_buffer(right, pieces[into].shape, pieces[into].dtype)
            OPS[op](pieces[into], incoming, out=reduced)
    if n == 1:
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


def allreduce_ring_plain(comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """The ring all-reduce as the textbook (and exercise 03.1) has it: cut a copy of x into N
    chunks, reduce-scatter them, all-gather them, join them."""
    pieces = np.array_split(x.reshape(-1).copy(), comm.world_size)  # N chunks, sizes differ by ≤ 1
    reduce_scatter_ring(comm, pieces, op)  # rank r now holds chunk r, reduced over every rank
    all_gather_ring(comm, pieces)  # and now every rank holds every reduced chunk
    return np.concatenate(pieces).reshape(x.shape)


@allreduce_algorithm("ring", layout="ring", phases=("reduce_scatter", "all_gather"),
                     cost=costmodel.ring, link_cost=costmodel.ring_on_links, colour="#0072B2")
def allreduce_ring(comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """Ring all-reduce = reduce-scatter + all-gather; bandwidth-optimal, 2(N-1) latency steps.

    `allreduce_ring_plain` with memory passes counted like bytes on the wire: the input is read
    once, where its chunks are first sent or reduced, and the result written once, chunk by chunk
    (no copy of x, no concatenate).
    """
    out = np.empty_like(x)
    mine = np.array_split(x.reshape(-1), comm.world_size)  # N chunks, sizes differ by ≤ 1
    result = np.array_split(out.reshape(-1), comm.world_size)  # views of the result
    reduce_scatter_ring_into(comm, mine, result, op)  # result[rank]: chunk `rank` reduced
    all_gather_ring(comm, result, copy_into=True)  # and every other chunk arrives into the result
    return out
