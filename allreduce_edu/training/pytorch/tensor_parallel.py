"""A tensor-parallel MLP block whose LayerNorm is the fused reduce-scatter + norm + all-gather, as
an autograd function. Introduced in lessons/13_pytorch.

Megatron-LM (Shoeybi et al. 2019) splits an MLP over N ranks: the first linear layer by output
columns (column-parallel: each rank has ffn/N of the hidden units), the second by input rows
(row-parallel: each rank's product is a partial sum of the output). Sequence parallelism
(Korthikanti et al. 2022) does the sum as a reduce-scatter by rows, normalises each rank's rows,
and all-gathers them: fused.py's operator. Its backward is the mirror image:

    forward   reduce-scatter partials → + residual, LayerNorm on my rows → all-gather the rows
    backward  reduce-scatter dY → LayerNorm's backward on my rows → all-gather dS
              + all-reduce of the norm's weight and bias gradients (each rank's cover its rows)

A replicated activation's gradient travels as partial sums, as in Megatron: each rank holds a
part and the sum over ranks is the gradient (the next reduce-scatter adds them). The same
`block` runs in one process with `layer_norm` as the norm, which is what the tests compare with.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ... import kernels
from ...collectives import allreduce
from ...collectives.ring import all_gather_ring, reduce_scatter_ring, reduce_scatter_ring_into

PARAMETERS = ("fc1.weight", "fc1.bias", "fc2.weight", "layernorm.weight", "layernorm.bias")


def sync_norm_grads(comm, grad_weight: np.ndarray, grad_bias: np.ndarray):
    """The norm's weight and bias gradients summed over the ranks, in one all-reduce: each rank's
    covers only the rows it normalised."""
    both = allreduce(comm, np.concatenate([grad_weight, grad_bias]))  # (2 · hidden,)
    return both[:len(grad_weight)], both[len(grad_weight):]


def _my_rows(comm, rows: int) -> slice:
    """The rows rank r normalises: piece r of np.array_split, as the ring's chunks."""
    sizes = [len(p) for p in np.array_split(np.empty(rows), comm.world_size)]
    lo = sum(sizes[:comm.rank])
    return slice(lo, lo + sizes[comm.rank])


class SequenceParallelNorm(torch.autograd.Function):
    """LayerNorm(sum over ranks of `partial` + residual): fused forward, mirrored backward."""

    @staticmethod
    def forward(ctx, partial, residual, weight, bias, comm, eps, sync):
        z = partial.detach().contiguous().numpy()  # (rows, hidden): this rank's partial sum
        gamma, beta = weight.detach().numpy(), bias.detach().numpy()
        n, r, mine = comm.world_size, comm.rank, _my_rows(comm, len(z))
        res = residual.detach().numpy()[mine]  # (my rows, hidden): added once, where normalised
        out = np.empty_like(z)
        pieces, result = np.array_split(z, n), np.array_split(out, n)  # n × (rows_i, hidden)
        saved = {}

        def add_and_normalise(acc, incoming):
            # the last reduce-scatter step: my rows' sum (autograd keeps it), normalised at once
            saved["sum"] = acc + incoming + res  # (my rows, hidden)
            return kernels.sum_layernorm([saved["sum"]], gamma, beta, eps, out=result[r])

        with comm.collective("sequence_parallel_norm", algorithm="forward", op="sum",
                             dtype=z.dtype, shape=z.shape):
            if n == 1:
                add_and_normalise(pieces[0], np.zeros_like(pieces[0]))
            else:
                reduce_scatter_ring_into(comm, pieces, result, "sum", last=add_and_normalise)
                all_gather_ring(comm, result, copy_into=True)  # every rank gets every row
        ctx.comm, ctx.eps, ctx.sync, ctx.mine = comm, eps, sync, mine
        ctx.save_for_backward(torch.from_numpy(saved["sum"]), weight, bias)
        return torch.from_numpy(out)

    @staticmethod
    def backward(ctx, grad_out):
        comm, mine = ctx.comm, ctx.mine
        total, weight, bias = ctx.saved_tensors
        g = grad_out.contiguous().numpy()  # (rows, hidden): partial sums, one part per rank
        n, r = comm.world_size, comm.rank
        with comm.collective("sequence_parallel_norm", algorithm="backward", op="sum",
                             dtype=g.dtype, shape=g.shape):
            # reduce-scatter dY: rank r gets the whole gradient of its rows
            pieces = [p.copy() for p in np.array_split(g, n)]
            dy = reduce_scatter_ring(comm, pieces, "sum") if n > 1 else pieces[0]
            # LayerNorm's backward on my rows: torch's autograd, no communication
            s, w, b = (t.detach().requires_grad_() for t in (total, weight, bias))
            with torch.enable_grad():
                y = F.layer_norm(s, (s.shape[-1],), w, b, ctx.eps)
                ds, dw, db = torch.autograd.grad(y, (s, w, b), torch.from_numpy(dy))
            # all-gather dS: every rank's partial fed every row of the sum
            ds_all = np.empty_like(g)
            rows = np.array_split(ds_all, n)
            rows[r][...] = ds.numpy()
            if n > 1:
                all_gather_ring(comm, rows, copy_into=True)
        # the weight and bias gradients cover my rows only: ctx.sync makes them the batch's
        # (lesson 13's exercise 13.2; its own collective, so the trace counts its bytes apart)
        dw, db = ctx.sync(comm, dw.numpy(), db.numpy())
        d_residual = np.zeros_like(g)
        d_residual[mine] = ds.numpy()  # the residual was added on my rows only
        return (torch.from_numpy(ds_all), torch.from_numpy(d_residual),
                torch.as_tensor(np.asarray(dw), dtype=weight.dtype),
                torch.as_tensor(np.asarray(db), dtype=bias.dtype), None, None, None)


def sequence_parallel_norm(comm, partial, residual, weight, bias, eps: float = 1e-5,
                           sync=sync_norm_grads):
    """LayerNorm(Σ_ranks partial + residual) on every rank, differentiable; `sync(comm, dw, db)`
    sums the norm's gradients over the ranks (lesson 13's exercise writes it)."""
    return SequenceParallelNorm.apply(partial, residual, weight, bias, comm, float(eps), sync)


def full_parameters(hidden: int = 16, ffn: int = 32, seed: int = 0) -> dict:
    """The block's parameters in one process, by PARAMETERS name (float64 tensors)."""
    rng = np.random.default_rng(seed)
    shapes = {"fc1.weight": (ffn, hidden), "fc1.bias": (ffn,), "fc2.weight": (hidden, ffn)}
    params = {k: rng.normal(scale=1 / np.sqrt(shape[-1]), size=shape)
              for k, shape in shapes.items()}
    params["layernorm.weight"] = 1 + 0.1 * rng.normal(size=hidden)
    params["layernorm.bias"] = 0.1 * rng.normal(size=hidden)
    return {k: torch.from_numpy(v).requires_grad_() for k, v in params.items()}


def shard_parameters(full: dict, rank: int, world_size: int) -> dict:
    """Rank `rank`'s share: fc1 by output columns, fc2 by input rows (the same hidden units),
    the norm's weight and bias whole."""
    units = np.array_split(np.arange(len(full["fc1.bias"])), world_size)[rank]  # my ffn units
    lo, hi = units[0], units[-1] + 1
    shard = {"fc1.weight": full["fc1.weight"][lo:hi], "fc1.bias": full["fc1.bias"][lo:hi],
             "fc2.weight": full["fc2.weight"][:, lo:hi],
             "layernorm.weight": full["layernorm.weight"], "layernorm.bias": full["layernorm.bias"]}
    return {k: v.detach().clone().requires_grad_() for k, v in shard.items()}


def block(x, p: dict, norm):
    """LayerNorm(x + fc2(gelu(fc1(x)))): one process with norm = layer_norm, or one rank's
    shard with norm = the sequence-parallel one."""
    h = F.gelu(F.linear(x, p["fc1.weight"], p["fc1.bias"]))  # (rows, ffn / N): column-parallel
    partial = F.linear(h, p["fc2.weight"])  # (rows, hidden): row-parallel, a partial sum
    return norm(partial, x, p["layernorm.weight"], p["layernorm.bias"])


def one_process_norm(partial, residual, weight, bias, eps: float = 1e-5):
    """The reference: torch's layer_norm of the whole sum."""
    return F.layer_norm(partial + residual, (partial.shape[-1],), weight, bias, eps)
