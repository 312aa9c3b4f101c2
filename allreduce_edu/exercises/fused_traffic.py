"""Lesson 07's fused LayerNorm, checked: each rank's result, the rows it normalised, its bytes."""

from __future__ import annotations

import math

import numpy as np

from ..kernels.reference import layernorm_reference
from .harness import Spy
from .row_count import CountRows


class _Shapes(Spy):
    """Lesson 07's Spy: also writes down the shape of every array sent (rows? columns? flat?)."""

    def __init__(self, comm):
        super().__init__(comm, ("send", "recv", "sendrecv"))
        self.shapes: list[tuple] = []

    def _note(self, dst, array) -> None:
        super()._note(dst, array)
        self.shapes.append(tuple(np.shape(array)))


def fused_input(rank: int, shape, seed: int = 7) -> np.ndarray:
    """Rank r's partial activation for the checker: float32, with an offset so LayerNorm has a mean
    to remove."""
    rng = np.random.default_rng([seed, rank])
    return (rng.standard_normal(shape) + 2.0 + rank).astype(np.float32)


def fused_on_rank(comm, blob: bytes, shape) -> dict:
    """On one rank: run the learner's function through a Spy, counting the rows it normalises."""
    import cloudpickle

    x = fused_input(comm.rank, shape)
    spy = _Shapes(comm)
    with CountRows() as count:
        fn = cloudpickle.loads(blob)[0]  # after patching: names imported from kernels are counted
        y = fn(spy, x)
    report = {"rows": count.rows, "modified": not np.array_equal(x, fused_input(comm.rank, shape)),
              "message_bytes": [s[1] for s in spy.sends], "message_shapes": spy.shapes,
              "y": None, "returned": None}
    if isinstance(y, (list, tuple)):
        report["returned"] = ("list", len(y))
        return report
    try:
        report["y"] = None if y is None else np.asarray(y)
    except Exception:  # noqa: BLE001 - whatever the learner returned
        report["returned"] = ("type", type(y).__name__)
    if report["y"] is not None and report["y"].dtype == object:
        report["returned"], report["y"] = ("type", type(y).__name__), None
    return report


def _reference(n: int, shape) -> np.ndarray:
    return layernorm_reference(sum(fused_input(r, shape).astype(np.float64) for r in range(n)))


def _close(y, ref) -> bool:
    return y.shape == ref.shape and bool(
        np.all(np.abs(y.astype(np.float64) - ref) <= 1e-4 * max(1.0, np.abs(ref).max())))


_WHOLE_ROWS = ("LayerNorm normalises each row over all of its columns, so a rank needs whole rows: "
               "split along axis 0, np.array_split(x.copy(), N, axis=0).")


def _return_problem(r: int, rep: dict, n: int, shape) -> str | None:
    """What is wrong with the type, dtype or shape rank r returned; None for an array like x."""
    rows, hidden = shape
    owned = [len(p) for p in np.array_split(np.empty(rows), n)]  # rows of each rank's piece
    returned, y = rep["returned"], rep["y"]
    if returned and returned[0] == "list":
        return (f"rank {r} returned a list of {returned[1]} arrays: all_gather_ring gives back the "
                f"list of N pieces; join them into one array of x's shape with "
                f"np.concatenate(pieces, axis=0).")
    if returned:
        return f"rank {r} returned a {returned[1]}: return a NumPy array of x's shape."
    if y is None:
        return (f"rank {r} returned None: return every normalised row, "
                f"np.concatenate(all_gather_ring(comm, pieces), axis=0).")
    if y.dtype.kind != "f":
        return f"rank {r} returned a {y.dtype} array: return the float32 rows."
    if y.dtype != np.float32:
        return (f"rank {r} returned {y.dtype} rows, but x is float32: keep x's dtype (a {y.dtype} "
                f"copy of x also sends {y.dtype.itemsize // 4}× the bytes around the ring).")
    if y.shape != tuple(shape):
        if y.ndim == 2 and y.shape[1] == hidden and y.shape[0] == owned[r] != rows:
            return (f"rank {r} returned only its own {owned[r]} of {rows} rows: after "
                    f"reduce-scatter, all-gather the normalised pieces so every rank holds all "
                    f"rows (all_gather_ring).")
        return (f"rank {r} returned shape {y.shape}, but x has shape {tuple(shape)}: return an "
                f"array of x's shape.")
    return None


def _split_problem(r: int, rep: dict, shape) -> str | None:
    """Rank r's result is wrong: did it cut x into something other than whole rows?"""
    rows, hidden = shape
    for got in rep["message_shapes"]:
        if len(got) == 2 and got[1] != hidden and got[1] > 0:
            return (f"rank {r} sent pieces of shape {got}: slices of columns, and its result is "
                    f"wrong. {_WHOLE_ROWS}")
    split = [b for b in rep["message_bytes"] if b % (hidden * 4)]
    if split or any(len(got) == 1 and got[0] != hidden for got in rep["message_shapes"]):
        what = (f"a message of {split[0]} bytes, not a whole number of rows ({hidden * 4} bytes "
                f"each)" if split else "flat pieces of x")
        return (f"rank {r} sent {what}, and its result is wrong: LayerNorm needs whole rows on one "
                f"rank. Split by rows, np.array_split(x.copy(), N, axis=0), not x.reshape(-1).")
    return None


def fused_problem(reports, n: int, shape, sent: dict) -> str | None:
    """The first thing wrong with a fused reduce + LayerNorm + broadcast: results, input, rows,
    bytes."""
    rows, hidden = shape
    row_bytes = hidden * 4
    ref = _reference(n, shape)
    owned = [len(p) for p in np.array_split(np.empty(rows), n)]  # rows of each rank's piece
    for r, rep in enumerate(reports):
        problem = _return_problem(r, rep, n, shape)
        if problem:
            return problem
    for r, rep in enumerate(reports):
        if rep["modified"]:
            return (f"rank {r}'s input x changed: np.array_split(x, N, axis=0) returns views of x, "
                    f"so the reduction writes into the caller's array. Split a copy: "
                    f"np.array_split(x.copy(), N, axis=0).")
    for r, rep in enumerate(reports):
        if _close(rep["y"], ref):
            continue
        problem = _split_problem(r, rep, shape)
        if problem:
            return problem
        total = sum(fused_input(q, shape).astype(np.float64) for q in range(n))
        if np.allclose(rep["y"], total, rtol=1e-4, atol=1e-4):
            return (f"rank {r} holds the sum of the ranks' x, not normalised: pass last=... to "
                    f"reduce_scatter_ring so its last step calls kernels.add_layernorm.")
        if np.array_equal(rep["y"], fused_input(r, shape)):
            return (f"rank {r} returned its own x, unchanged: reduce_scatter_ring and "
                    f"all_gather_ring work on your list of pieces, so return the gathered pieces, "
                    f"joined with "
                    f"np.concatenate(..., axis=0).")
        lo = sum(owned[:r])
        mine = slice(lo, lo + owned[r])
        if owned[r] and _close(rep["y"][mine], layernorm_reference(fused_input(r, shape)[mine])):
            return (f"rank {r}'s own rows {lo}..{lo + owned[r] - 1} are LayerNorm of rank {r}'s x "
                    f"alone: the last step must add what arrives too — norm(acc + incoming): "
                    f"kernels.add_layernorm(acc, incoming).")
        worst = np.abs(rep["y"] - ref) > 1e-4 * max(1.0, np.abs(ref).max())
        bad = np.flatnonzero(np.any(worst, axis=1))
        return (f"rank {r}'s row {bad[0]} differs from LayerNorm(sum over ranks of x) (float64 "
                f"reference) by up to {np.abs(rep['y'][bad[0]] - ref[bad[0]]).max():.2g}: check "
                f"what your last step adds and normalises.")
    counts = [rep["rows"] for rep in reports]
    if sum(counts) == 0:
        return ("the checker saw no rows normalised through allreduce_edu.kernels: normalise with "
                "kernels.add_layernorm in reduce-scatter's last step (last=...), so the sum and "
                "the norm are one pass.")
    if rows and all(c >= rows for c in counts):
        return (f"you normalised all rows on every rank (rows normalised per rank: {counts}) — "
                f"that is the unfused variant. Normalise only the rows you own, in "
                f"reduce-scatter's last step, then all-gather them.")
    if rows and counts[0] >= rows and not any(counts[1:]):
        return (f"only rank 0 normalised, all {rows} rows — that is the root variant. In the fused "
                f"variant every rank normalises the rows it owns after reduce-scatter (about "
                f"rows/N each).")
    if sum(counts) > rows:
        return (f"{sum(counts)} rows were normalised for {rows} rows in all (per rank: {counts}): "
                f"normalise each row once, on the rank that owns it — inside the last "
                f"reduce-scatter step, not again afterwards.")
    if max(counts) > math.ceil(rows / n):
        return (f"ranks normalised {counts} rows: the work should be spread evenly, at most "
                f"⌈rows/N⌉ = {math.ceil(rows / n)} each (np.array_split(x, N, axis=0) gives every "
                f"rank its share).")
    s = rows * hidden * 4
    ring_total = 2 * (n - 1) * s
    limit = 2 * (n - 1) * math.ceil(rows / n) * row_bytes
    for r in range(n):
        if sent.get(r, 0) > limit:
            return (f"rank {r} sent {sent.get(r, 0)} bytes; a ring all-reduce sends 2(N−1)/N·S = "
                    f"{2 * (n - 1) * s / n:.0f} per rank (S = {s}): pass pieces of 1/N of the rows "
                    f"around the ring.")
    if sum(sent.values()) != ring_total:
        return (f"your ranks sent {sum(sent.values())} bytes in all; a ring all-reduce of S = {s} "
                f"bytes sends 2(N−1)·S = {ring_total}: N − 1 reduce-scatter and N − 1 all-gather "
                f"steps of S/N per rank.")
    return None


_RUN_IT = ("Run it yourself to see the traceback: Cluster(3, transport=\"local\").run(my_fused, "
           "np.ones((10, 16), np.float32)).")


def fused_explain(e: BaseException) -> str:
    """A hint for an exception your function raised on a rank (the library's words are not one)."""
    text = str(e)
    if "deadline" in text or "never came" in text or "Timeout" in type(e).__name__:
        return ("reduce_scatter_ring and all_gather_ring take the list of N pieces, and every rank "
                "must call both")
    if "C-contiguous" in text:
        return ("your pieces are not whole rows: the kernels write into acc in place, so acc must "
                "be a block of whole rows, and a piece of np.array_split(x, N, axis=1) is a slice "
                "of columns. " + _WHOLE_ROWS)
    if "gamma must have shape" in text or "eps must be" in text:
        return ("reduce_scatter_ring calls last(acc, incoming) with two arrays, and a norm of one "
                "array takes the second as gamma. Give last= a function of both that adds and "
                "normalises: kernels.add_layernorm(acc, incoming, out=acc).")
    if "not callable" in text:
        return ("last= takes a function, which reduce_scatter_ring calls as last(acc, incoming) at "
                "its final step; you passed the result of a call. Write a function of (acc, "
                "incoming), or a lambda.")
    if "broadcast together" in text or "shape mismatch" in text:
        return ("the piece that arrived and the piece it is added to have different shapes: every "
                "rank must cut x the same way, into N = comm.world_size pieces of whole rows, "
                "np.array_split(x.copy(), N, axis=0).")
    if "dtype mismatch" in text or "float32 or float64" in text:
        return "keep x's dtype, float32, on every rank: the kernels add and normalise float rows."
    if "object is not subscriptable" in text or "has no len" in text:
        return ("reduce_scatter_ring and all_gather_ring take a list of N pieces (one per rank), "
                "not the array x itself.")
    return _RUN_IT
