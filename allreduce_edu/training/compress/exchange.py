"""A compressed all-reduce = a compressed reduce-scatter + an all-gather of compressed chunks.

The reduce-scatter moves the chunks one of two ways, and that choice sets how often a value is
rounded:

- direct (`hops="once"`): every rank sends chunk d, encoded, straight to its owner d (an
  all-to-all, MPI_Alltoall); the owner decodes the N contributions, sums them in float32 and
  encodes the sum once for the all-gather. Every value is rounded twice whatever N is: torchft's
  FP8 all-reduce (torchft/collectives.py) and DeepSpeed's 1-bit all-reduce move chunks this way.
- around the ring (`hops="ring"`): as the ring of lessons/03, but each hop decodes what arrived,
  adds its own chunk and encodes the partial sum again: N roundings of every value, so the error
  grows with N. This is what a bf16 (or fp8) all-reduce that reduces in its wire format does.

Both send every chunk N-1 times in each phase, so they move the same bytes:
2(N-1)·Σ codec.nbytes(chunk) over all ranks.
"""

from __future__ import annotations

import numpy as np

from ...collectives.ring import all_gather_ring
from .codecs import Codec
from .formats import as_float32

HOPS = ("once", "ring")


def all_to_all(comm, pieces: list[np.ndarray], tag: str = "all_to_all") -> list[np.ndarray]:
    """pieces[d] goes to rank d; returns the pieces every rank sent this one, by src."""
    n, r = comm.world_size, comm.rank
    received = [None] * n
    received[r] = pieces[r]
    for step in range(1, n):
        # step s: send piece (r + s) % n to its owner, receive ours from rank (r - s) % n
        dst, src = (r + step) % n, (r - step) % n
        received[src] = comm.sendrecv(dst, pieces[dst], src, tag, step=step - 1, chunk=dst)
    return received


def reduce_scatter_once(comm, chunks: list[np.ndarray], codec: Codec) -> np.ndarray:
    """Chunk `rank` summed over the ranks, float32: each contribution encoded once, sent to us."""
    received = all_to_all(comm, [codec.encode(c) for c in chunks])
    total = np.zeros(len(chunks[comm.rank]), np.float32)
    for wire in received:  # in rank order: every owner sums in the same order
        total += codec.decode(wire)
    return total


def reduce_scatter_hops(comm, chunks: list[np.ndarray], codec: Codec) -> np.ndarray:
    """Chunk `rank` summed over the ranks, float32: around the ring, re-encoded at every hop."""
    n, r = comm.world_size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    total = as_float32(chunks[r])
    outgoing = codec.encode(chunks[(r - 1) % n])  # step 0 sends this rank's own chunk
    for step in range(n - 1):
        # step s: send partial chunk (r - s - 1) % n right, add ours to (r - s - 2) % n from left
        send, into = (r - step - 1) % n, (r - step - 2) % n
        incoming = comm.sendrecv(right, outgoing, left, "reduce_scatter", step=step, chunk=send)
        total = codec.decode(incoming) + chunks[into]
        if step < n - 2:  # not the last: it goes on to the right, encoded again
            outgoing = codec.encode(total)
    return total


def allreduce_encoded(comm, x, codec: Codec, hops: str = "once") -> np.ndarray:
    """The sum of x over the ranks, every message in `codec`; x's shape and dtype, the same bits
    on every rank (each rank decodes the same encoded chunks)."""
    if hops not in HOPS:
        raise ValueError(f"rank {comm.rank}: hops must be one of {', '.join(HOPS)}, got {hops!r}")
    x = np.asarray(x)
    flat = as_float32(x).reshape(-1)
    with comm.collective("allreduce", algorithm=f"{codec.name}_{hops}", op="sum", dtype=x.dtype,
                         shape=x.shape):
        chunks = np.array_split(flat, comm.world_size)  # (N,) views, sizes differ by <= 1
        scatter = reduce_scatter_once if hops == "once" else reduce_scatter_hops
        pieces = [None] * comm.world_size
        pieces[comm.rank] = codec.encode(scatter(comm, chunks, codec))  # our chunk, summed
        pieces = all_gather_ring(comm, pieces)  # every rank's encoded chunk, by rank
    total = np.concatenate([codec.decode(p) for p in pieces]) if flat.size else flat
    return total.reshape(x.shape).astype(x.dtype)


def encoded_bytes(codec: Codec, count: int, world_size: int) -> int:
    """Bytes all ranks send, both phases, for `count` values: 2(N-1)·Σ codec.nbytes(chunk)."""
    chunks = [len(c) for c in np.array_split(np.empty(count), world_size)]
    return 2 * (world_size - 1) * sum(codec.nbytes(c) for c in chunks)
