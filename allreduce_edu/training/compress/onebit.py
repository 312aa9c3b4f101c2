"""1-bit all-reduce: every value sent as its sign, a float32 scale per chunk, two error buffers.

Seide et al. (2014); Tang et al., "1-bit Adam" (2021): DeepSpeed's `compressed_allreduce`
(deepspeed/runtime/comm/nccl.py), step by step:

1. worker: add the worker error, cut the buffer into N chunks, send chunk d's signs (np.packbits)
   and scale ‖chunk‖/√len to rank d (an all-to-all); keep what the signs dropped (worker error);
2. server: rank d averages the N chunks d it received, adds its server error, compresses the
   average to signs and one scale again, keeps what those dropped (server error);
3. all-gather the N compressed chunks; every rank decodes the same mean.

Both phases carry ⌈len/8⌉ + 4 bytes a chunk: about 1/32 of float32's traffic. The buffer is padded
with zeros to a multiple of 8·N so every chunk packs into whole bytes (as DeepSpeed pads its
worker error). DeepSpeed scales the worker's whole buffer by one number; here each chunk has its
own scale, which costs nothing more, as a scale travels with each chunk either way.
"""

from __future__ import annotations

import numpy as np

from ...collectives.ring import all_gather_ring
from .casts import check_float
from .codecs import SIGN
from .exchange import all_to_all
from .feedback import ErrorFeedback
from .schemes import Scheme, count


def padded_size(size: int, world_size: int) -> int:
    """`size` rounded up to a multiple of 8·N: N chunks of whole bytes of sign bits."""
    block = 8 * world_size
    return -(-size // block) * block


def _signs(chunks: list[np.ndarray], wires: list) -> np.ndarray:
    """scale · sign of each chunk, concatenated; the encoded chunks go into `wires`."""
    wires[:] = [SIGN.encode(c) for c in chunks]
    return np.concatenate([SIGN.decode(w) for w in wires])


class OneBit(Scheme):
    """Sign compression with a worker and a server error buffer per bucket (key)."""

    name = "onebit"

    def __init__(self, audit: bool = False):
        super().__init__("ring")
        self.worker = ErrorFeedback(audit)  # what this rank's signs dropped, per bucket
        self.server = ErrorFeedback(audit)  # what its chunk's signs dropped, per bucket

    def mean(self, comm, flat, shapes=None, key=0, last=True) -> np.ndarray:
        flat = check_float(comm, flat)
        n, size = comm.world_size, flat.size
        buffer = np.zeros(padded_size(size, n), np.float32)  # (8·N·k,) zeros after the data
        buffer[:size] = flat.reshape(-1)
        with comm.collective("allreduce", algorithm="onebit", op="sum", dtype=flat.dtype,
                             shape=flat.shape):
            # 1. worker: signs of (buffer + worker error), chunk d to rank d
            wires: list = []
            self.worker.step(key, buffer, lambda b: _signs(np.split(b, n), wires))
            received = all_to_all(comm, wires)
            # 2. server: the mean of our chunk, plus the server error, compressed again
            average = sum(SIGN.decode(w) for w in received) / np.float32(n)
            mine: list = []
            self.server.step(key, average, lambda a: _signs([a], mine))
            # 3. every rank gets every compressed chunk of the mean
            pieces = [None] * n
            pieces[comm.rank] = mine[0]
            pieces = all_gather_ring(comm, pieces)
        mean = np.concatenate([SIGN.decode(p) for p in pieces])[:size]
        return mean.reshape(flat.shape).astype(flat.dtype)

    def bytes_per_step(self, shapes, dtype, world_size: int, step: int = 0) -> int:
        """2N(N-1) messages (all-to-all, then all-gather), each ⌈len/8⌉ + 4 bytes."""
        chunk = padded_size(count(shapes), world_size) // world_size
        return 2 * world_size * (world_size - 1) * SIGN.nbytes(chunk)
