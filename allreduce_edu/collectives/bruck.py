"""Bruck's logarithmic all-gather and reduce-scatter, for any N, and the all-reduce they make.
Introduced in lessons/05.

Bruck, Ho, Kipnis, Upfal & Weathersby, "Efficient algorithms for all-to-all communications in
multiport message-passing systems" (1997); NCCL 2.23's PAT all-gather and reduce-scatter build on it
(Jeaugey et al., arXiv 2506.20252). ⌈log2 N⌉ steps where the ring takes N-1, with the ring's
(N-1)/N·S bytes per rank: at step k a rank sends the 2^k chunks it holds (the last step, what is
left) to the rank 2^k away. Chunks are counted from the rank itself: N need not be a power of two.
"""

from __future__ import annotations

import numpy as np

from ..model import costmodel
from ..ops import OPS
from .registry import allreduce_algorithm


def _distances(n: int) -> list[tuple[int, int]]:
    """(2^k, how many chunks go that far) for k = 0 .. ⌈log2 N⌉ - 1."""
    return [(1 << k, min(1 << k, n - (1 << k))) for k in range((n - 1).bit_length())]


def _span(first: int, count: int, n: int) -> tuple[int, int]:
    """Chunks first .. first + count - 1 (mod N) as the trace's [lo, hi): lo < 0 where the run
    wraps past chunk N-1 (replay reads (-1, 2) as chunks N-1, 0, 1)."""
    lo = first % n
    return (lo, lo + count) if lo + count <= n else (lo - n, lo + count - n)


def _pack(pieces, first: int, count: int) -> np.ndarray:
    """Chunks first, first + 1, ... (mod N) as one flat message (one chunk: no copy)."""
    n = len(pieces)
    flat = [pieces[(first + j) % n].reshape(-1) for j in range(count)]
    return flat[0] if count == 1 else np.concatenate(flat)


def _unpack(message: np.ndarray, pieces, first: int, count: int):
    """Yield (chunk, its part of `message`) for chunks first, first + 1, ... (mod N)."""
    n, offset = len(pieces), 0
    for j in range(count):
        b = (first + j) % n
        yield b, message[offset:offset + pieces[b].size].reshape(pieces[b].shape)
        offset += pieces[b].size


def all_gather_bruck(comm, pieces: list[np.ndarray], tag: str = "all_gather") -> list[np.ndarray]:
    """Fill `pieces` (N arrays of their chunks' shapes; rank r's own is pieces[r]) with every rank's
    chunk, in ⌈log2 N⌉ steps."""
    n, r = comm.world_size, comm.rank
    for step, (distance, count) in enumerate(_distances(n)):
        # step k: I hold chunks r .. r + 2^k - 1; send the first `count` to r - 2^k and receive
        # chunks r + 2^k .. from r + 2^k, who holds them as its own first ones
        incoming = comm.sendrecv((r - distance) % n, _pack(pieces, r, count), (r + distance) % n,
                                 tag, step=step, chunk=_span(r, count, n))
        for b, part in _unpack(incoming, pieces, r + distance, count):
            pieces[b][...] = part
    return pieces


def reduce_scatter_bruck(comm, pieces: list[np.ndarray], op: str = "sum") -> np.ndarray:
    """Rank r gets chunk r of `pieces` (its N chunks, never changed) reduced over all ranks: the
    all-gather run backwards, in ⌈log2 N⌉ steps."""
    n, r = comm.world_size, comm.rank
    acc = list(pieces)  # acc[b]: my partial reduction of chunk b (the caller's array until reduced)
    for step, (distance, count) in enumerate(reversed(_distances(n))):
        # step k: send my partials of chunks r + d .. r + d + count - 1 to r + d (d = 2^(K-1-k)),
        # where they are the first chunks; reduce what r - d sends for chunks r .. r + count - 1
        incoming = comm.sendrecv((r + distance) % n, _pack(acc, r + distance, count),
                                 (r - distance) % n, "reduce_scatter", step=step,
                                 chunk=_span(r + distance, count, n))
        for b, part in _unpack(incoming, acc, r, count):
            acc[b] = OPS[op](acc[b], part)
    return acc[r] if n > 1 else acc[r].copy()


def all_gatherv_bruck(comm, x: np.ndarray) -> np.ndarray:
    """Every rank's x joined along axis 0 in rank order; lengths may differ, so a Bruck all-gather
    of the lengths (tag "sizes", 8 bytes a rank) goes first."""
    n, r = comm.world_size, comm.rank
    lengths = [np.zeros(1, np.int64) for _ in range(n)]
    lengths[r][0] = len(x)
    all_gather_bruck(comm, lengths, tag="sizes")
    rows = [int(length[0]) for length in lengths]
    out = np.empty((sum(rows),) + x.shape[1:], x.dtype)
    pieces = np.split(out, np.cumsum(rows)[:-1])  # views of the result, one per rank
    pieces[r][...] = x
    all_gather_bruck(comm, pieces)
    return out


@allreduce_algorithm("bruck", layout="circle", phases=("reduce_scatter", "all_gather"),
                     cost=costmodel.bruck, colour="#A6761D")
def allreduce_bruck(comm, x: np.ndarray, op: str = "sum") -> np.ndarray:
    """Bruck reduce-scatter + Bruck all-gather: the ring's bytes in 2⌈log2 N⌉ steps."""
    out = np.empty_like(x)
    result = np.array_split(out.reshape(-1), comm.world_size)  # views of the result
    result[comm.rank][...] = reduce_scatter_bruck(comm, np.array_split(x.reshape(-1),
                                                                       comm.world_size), op)
    all_gather_bruck(comm, result)  # every other chunk arrives into the result
    return out
