"""Reduce + LayerNorm + Broadcast: every rank ends with norm(sum over ranks of x). Introduced in
lessons/07.

Row-parallel matmuls (Megatron-LM, Shoeybi et al. 2019) leave each rank a partial activation whose
sum is normalised next. Sequence parallelism (Korthikanti et al. 2022) splits that all-reduce into a
reduce-scatter and an all-gather and normalises between them, on 1/N of the rows; TensorRT-LLM and
vLLM fuse the final reduction with residual add + RMSNorm the same way. Three variants, one result:

    unfused  ring all-reduce, then every rank normalises  2(N-1)/N·S per rank, rows per rank
             every row
    root     binomial reduce to rank 0, normalise there,  2(N-1)·S in all,    rows on rank 0
             broadcast
    fused    reduce-scatter by rows, last step adds +     2(N-1)/N·S per rank, rows/N per rank
             normalises in one pass (kernels.add_layernorm),
             all-gather the normalised rows

x may have any number of axes >= 1: the last is `hidden`, the others are flattened into rows (as
torch's layer_norm with normalized_shape=(hidden,)); a 1-D x is one row. gamma, beta and residual
must be the same on every rank (they are not sent).
"""

from __future__ import annotations

import numpy as np

from ..ops import check_norm  # kernels (and numba, ~0.5 s) load on first use
from .blocking import allreduce
from .ring import all_gather_ring, reduce_scatter_ring_into
from .tree import broadcast_tree, reduce_tree

VARIANTS = ("fused", "unfused", "root")


class _Normalise:
    """The per-row work every variant does somewhere: norm(sum [+ residual]) · gamma + beta,
    counted in rows."""

    def __init__(self, gamma, beta, eps, norm, residual):
        self.gamma, self.beta, self.eps, self.norm, self.residual = gamma, beta, eps, norm, residual
        self.rows = 0  # rows normalised on this rank: the work the variants divide differently

    def _residual(self, lo, count):
        """Rows [lo, lo + count) of the residual (added once, on whichever rank normalises them),
        or None."""
        return None if self.residual is None else self.residual[lo:lo + count]

    def __call__(self, acc, lo=0):
        """acc = norm(acc [+ residual]) in place, one pass: unfused, root, and a world of one
        rank."""
        from .. import kernels

        self.rows += len(acc)
        parts = [acc] if self.residual is None else [acc, self._residual(lo, len(acc))]
        return kernels.sum_layernorm(parts, self.gamma, self.beta, self.eps, out=acc,
                                     norm=self.norm)

    def add(self, acc, incoming, lo, out=None):
        """out = norm(acc + incoming [+ residual]) (out defaults to acc), one pass: the fused
        reduce-scatter's last step."""
        from .. import kernels

        self.rows += len(acc)
        return kernels.add_layernorm(acc, incoming, self.gamma, self.beta, self.eps,
                                     out=acc if out is None else out,
                                     residual=self._residual(lo, len(acc)), norm=self.norm)


def _fused(comm, x, normalise):
    """Reduce-scatter whole rows; the last reduce step and the norm are one pass; all-gather the
    rows. Like the ring all-reduce, it reads x once and writes the result once."""
    n, r = comm.world_size, comm.rank
    out = np.empty_like(x)
    if n == 1:  # a world of one has no ring steps: just normalise
        out[...] = x
        return normalise(out)
    # n × (rows_i, hidden): views of x (never written) and of the result; rank r owns piece r
    mine, result = np.array_split(x, n, axis=0), np.array_split(out, n, axis=0)
    lo = sum(len(p) for p in mine[:r])  # first row of my piece
    # reduce-scatter: N-1 ring steps; at the last one, my rows = norm(mine + sum of the others')
    # in one pass, written straight into the result
    reduce_scatter_ring_into(comm, mine, result, "sum",
                             last=lambda acc, incoming: normalise.add(acc, incoming, lo, result[r]))
    # all-gather: N-1 ring steps pass the normalised rows around, each copied into the result
    all_gather_ring(comm, result, copy_into=True)
    return out


def _unfused(comm, x, normalise):
    """Ring all-reduce of the sum, then every rank normalises every row (N times the work)."""
    total = allreduce(comm, x, "sum", algorithm="ring")  # (rows, hidden) on every rank
    return normalise(total)


def _root(comm, x, normalise):
    """Binomial-tree reduce to rank 0, normalise there, binomial-tree broadcast from rank 0."""
    total = reduce_tree(comm, x, "sum", root=0)  # the full sum on rank 0, partial sums elsewhere
    if comm.rank == 0:
        normalise(total)
    return broadcast_tree(comm, total, root=0)  # ⌈log2 N⌉ steps, every one moves the whole tensor


_BODIES = {"fused": _fused, "unfused": _unfused, "root": _root}


def _check(rank, x, gamma, beta, eps, residual, norm, variant):
    """Validate on this rank before anything is sent; return (x, gamma, beta, residual) ready for
    the kernels."""
    where = f"reduce_layernorm_broadcast on rank {rank}"
    if variant not in VARIANTS:
        raise ValueError(f"{where}: unknown variant {variant!r}; "
                         f"valid variants are {', '.join(VARIANTS)}")
    check_norm(norm, where)
    x = np.asarray(x)
    if x.dtype not in (np.float32, np.float64):
        raise TypeError(f"{where}: x has dtype {x.dtype}; "
                        "it must be float32 or float64 (cast with .astype)")
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(f"{where}: x needs a non-empty last (hidden) axis, got shape {x.shape}")
    hidden = x.shape[-1]
    if not np.isscalar(eps) or not eps >= 0:
        raise ValueError(f"{where}: eps must be a number >= 0, got {eps!r}")
    if norm == "rmsnorm" and beta is not None:
        raise ValueError(f"{where}: rmsnorm has no beta (it does not re-centre); pass beta=None")
    params = []
    for name, v in (("gamma", gamma), ("beta", beta)):
        if v is not None:
            v = np.ascontiguousarray(v, dtype=x.dtype)
            if v.shape != (hidden,):
                raise ValueError(f"{where}: {name} must have shape ({hidden},) "
                                 f"to match x's hidden axis, got {v.shape}")
        params.append(v)
    if residual is not None:
        residual = np.asarray(residual)
        if residual.shape != x.shape:
            raise ValueError(f"{where}: residual must have x's shape {x.shape}, "
                             f"got {residual.shape}")
        residual = np.ascontiguousarray(residual, dtype=x.dtype).reshape(-1, hidden)
    return x, *params, residual


def reduce_layernorm_broadcast(comm, x, gamma=None, beta=None, eps=1e-5, residual=None,
                               norm="layernorm", variant="fused", stats=None):
    """norm(sum over ranks of x [+ residual]) on every rank; `stats` (a dict), if given, gets
    "rows_normalised"."""
    x, gamma, beta, residual = _check(comm.rank, x, gamma, beta, eps, residual, norm, variant)
    normalise = _Normalise(gamma, beta, float(eps), norm, residual)
    # (rows, hidden); never written (bodies copy it)
    rows = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
    with comm.collective("reduce_layernorm_broadcast", algorithm=variant, op="sum", dtype=x.dtype,
                         shape=x.shape):
        y = _BODIES[variant](comm, rows, normalise)
    if stats is not None:
        stats["rows_normalised"] = normalise.rows
    return y.reshape(x.shape)
