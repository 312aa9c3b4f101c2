"""PowerSGD: each gradient matrix M (n×m) sent as two thin factors, P (n×r) and Q (m×r).

Vogels, Karimireddy & Jaggi, "PowerSGD: Practical low-rank gradient compression for distributed
optimization" (NeurIPS 2019); this mirrors torch/distributed/algorithms/ddp_comm_hooks/
powerSGD_hook.py step for step. One step of power iteration per training step, on every rank:

    P = M Q              all-reduce P (sum)      orthogonalise P (Gram-Schmidt)
    Q = Mᵀ P             all-reduce Q (mean)     M ≈ P Qᵀ

so (n + m)·r values travel instead of n·m: `compression_ratio(n, m, r)`. Vectors (biases) and
matrices too small to gain `min_compression_rate` go uncompressed, in one all-reduce. The
compressor is biased, so error feedback is on by default (feedback.py); Q is remembered from the
last step (warm start) and drawn at random, the same on every rank, only the first time; the first
`start_powerSGD_iter` steps are plain all-reduces, as early training is the most sensitive.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from .casts import check_float, ring_bytes
from .feedback import ErrorFeedback
from .schemes import Scheme, count


def compression_ratio(n: int, m: int, rank: int) -> float:
    """How many times fewer values an n×m matrix sends as rank-`rank` factors: nm / ((n+m)r)."""
    return n * m / ((n + m) * rank)


def orthogonalise(matrix: np.ndarray, epsilon: float = 0.0) -> np.ndarray:
    """Gram-Schmidt on the columns of `matrix` (n×r), in place, as torch's PowerSGD does; a
    column of zeros stays zero."""
    for i in range(matrix.shape[1]):
        col = matrix[:, i:i + 1]  # (n, 1), a view
        norm = np.linalg.norm(col)
        if norm == 0 and epsilon == 0:
            col[...] = 0
        else:
            col /= norm + epsilon
        rest = matrix[:, i + 1:]  # remove col's direction from the columns after it
        rest -= np.sum(col * rest, axis=0, keepdims=True) * col
    return matrix


def draw_normal(seed: int, shapes, dtype) -> list[np.ndarray]:
    """Standard-normal matrices of `shapes` from `seed`: every rank draws the same."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for shape in shapes]


class PowerSGD(Scheme):
    """Rank-`rank` PowerSGD with its state per bucket (key): residual, remembered Qs."""

    name = "powersgd"

    def __init__(self, rank: int = 1, error_feedback: bool = True, warm_start: bool = True,
                 start_powerSGD_iter: int = 2, min_compression_rate: float = 2.0,
                 algorithm="ring", seed: int = 0, epsilon: float = 0.0, draw=draw_normal,
                 audit: bool = False):
        super().__init__(algorithm)
        if not isinstance(rank, (int, np.integer)) or rank < 1:
            raise ValueError(f"PowerSGD rank must be a whole number >= 1, got {rank!r}")
        self.rank, self.error_feedback, self.warm_start = int(rank), error_feedback, warm_start
        # plain all-reduces before this step: 2, the least DDP allows with error feedback or
        # warm start (torch's default, 1000, is for long runs; the lessons' runs are ~100 steps)
        self.start_powerSGD_iter = start_powerSGD_iter
        self.min_compression_rate = min_compression_rate
        self.epsilon, self.draw = epsilon, draw  # draw(seed, shapes, dtype) -> random Qs
        self.iter = 0  # steps done (a step ends with its last bucket)
        self.feedback = ErrorFeedback(audit)  # one residual per bucket
        self.q_memory: dict = {}  # key -> the Qs of its compressed matrices, for warm start
        self._rng = np.random.RandomState(seed)  # one seed per fresh draw, as torch's state.rng

    def __repr__(self) -> str:
        return (f"PowerSGD(rank={self.rank}, error_feedback={self.error_feedback}, "
                f"warm_start={self.warm_start}, iter={self.iter})")

    def mean(self, comm, flat, shapes=None, key=0, last=True) -> np.ndarray:
        """≈ the mean over ranks of `flat`, which holds tensors of `shapes` (None: one tensor)."""
        x = check_float(comm, flat)
        flat = x.reshape(-1)  # (total,)
        shapes = [x.shape] if shapes is None else [tuple(s) for s in shapes]
        if count(shapes) != flat.size:
            raise ValueError(f"rank {comm.rank}: a bucket of {flat.size} values cannot hold "
                             f"tensors of shapes {shapes} ({count(shapes)} values)")
        if self.iter < self.start_powerSGD_iter:  # plain all-reduce, divided first
            result = np.asarray(self.summed(comm, flat / comm.world_size))
        elif self.error_feedback:
            result = self.feedback.step(key, flat, lambda m: self._round(comm, m, shapes, key))
        else:
            result = self._round(comm, flat, shapes, key)
        self.iter += bool(last)
        return result.reshape(x.shape)

    def plan(self, shapes) -> tuple[list[int], list[int]]:
        """(tensors compressed, grouped by shape as torch orders them; tensors sent as they are)."""
        by_shape, plain = defaultdict(list), []
        for i, shape in enumerate(shapes):
            if len(shape) < 2 or count([shape]) == 0:
                plain.append(i)  # vectors and scalars: no low-rank structure to use
                continue
            n, m = shape[0], count([shape[1:]])  # the matrix view (n, m), as torch's view(n, -1)
            if self.rank > min(n, m):
                raise ValueError(f"PowerSGD rank {self.rank} is more than min(n, m) = "
                                 f"{min(n, m)} for a gradient of shape {shape} (a {n}×{m} "
                                 f"matrix): its factors would be bigger than the matrix; use "
                                 f"rank <= {min(n, m)}")
            if (n + m) * self.rank * self.min_compression_rate < n * m:
                by_shape[(n, m)].append(i)
            else:
                plain.append(i)
        return [i for group in by_shape.values() for i in group], plain

    def _round(self, comm, flat: np.ndarray, shapes, key) -> np.ndarray:
        """One PowerSGD round of all ranks: the mean, compressed matrices as P Qᵀ (a new array)."""
        n_ranks, r = comm.world_size, self.rank
        out = flat.copy()  # (total,) the decompressed mean is written into its tensors
        ends = np.cumsum([0] + [count([s]) for s in shapes])
        tensors = [out[a:b] for a, b in zip(ends[:-1], ends[1:], strict=True)]
        squeezed, plain = self.plan(shapes)
        matrices = [tensors[i].reshape(shapes[i][0], -1) for i in squeezed]  # (n, m) views
        # the uncompressed tensors: one all-reduce of all of them, the mean
        if plain:
            flat_plain = np.concatenate([tensors[i] for i in plain])
            done = np.asarray(self.summed(comm, flat_plain)) / n_ranks
            ends_plain = np.cumsum([tensors[i].size for i in plain])[:-1]
            for i, piece in zip(plain, np.split(done, ends_plain), strict=True):
                tensors[i][...] = piece
        else:
            self.summed(comm, np.empty(0, flat.dtype))  # as torch: three all-reduces every step
        # Q: remembered (warm start) or drawn, the same on every rank; orthogonal columns
        q_shapes = [(m.shape[1], r) for m in matrices]
        remembered = self.q_memory.get(key) if self.warm_start else None
        if remembered is None or [q.shape for q in remembered] != q_shapes:
            remembered = self.draw(self._rng.randint(1_000_000_000), q_shapes, flat.dtype)
        qs = [orthogonalise(q.astype(flat.dtype, copy=True), self.epsilon) for q in remembered]
        # P = M Q, summed over the ranks, then orthogonalised
        ps = self._allreduce_all(comm, [m @ q for m, q in zip(matrices, qs, strict=True)],
                                 flat.dtype)
        ps = [orthogonalise(p, self.epsilon) for p in ps]
        # Q = Mᵀ P, averaged over the ranks; M ≈ P Qᵀ
        qs = self._allreduce_all(comm, [m.T @ p for m, p in zip(matrices, ps, strict=True)],
                                 flat.dtype)
        qs = [q / n_ranks for q in qs]
        for m, p, q in zip(matrices, ps, qs, strict=True):
            m[...] = p @ q.T
        if self.warm_start:
            self.q_memory[key] = qs
        return out

    def _allreduce_all(self, comm, factors: list[np.ndarray], dtype) -> list[np.ndarray]:
        """The sum over ranks of every factor, in one all-reduce of them packed together."""
        packed = np.concatenate([f.reshape(-1) for f in factors]) if factors else np.empty(0, dtype)
        total = np.asarray(self.summed(comm, packed))
        ends = np.cumsum([f.size for f in factors])[:-1]
        return [piece.reshape(f.shape) for piece, f in zip(np.split(total, ends), factors,
                                                            strict=True)]

    def bytes_per_step(self, shapes, dtype, world_size: int, step: int = 0) -> int:
        """Plain bytes before start_powerSGD_iter; then three ring all-reduces: the uncompressed
        tensors, the Ps (Σ n·r) and the Qs (Σ m·r)."""
        shapes = [tuple(s) for s in shapes]
        if step < self.start_powerSGD_iter:
            return super().bytes_per_step(shapes, dtype, world_size)
        squeezed, plain = self.plan(shapes)
        values = (count([shapes[i] for i in plain])
                  + sum((shapes[i][0] + count([shapes[i][1:]])) * self.rank for i in squeezed))
        return ring_bytes(world_size, values * np.dtype(dtype).itemsize)
