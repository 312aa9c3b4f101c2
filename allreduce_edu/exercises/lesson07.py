"""Lesson 07 · fused reduce + LayerNorm + broadcast: write the fused variant, count root bytes.

`check_fused` runs your `my_fused(comm, x)` on real gRPC ranks with uneven rows, counts the rows
each rank normalises through `allreduce_edu.kernels` (the checker wraps its norm functions on every
rank while your function runs) and the bytes each rank sends, and compares the result with the
float64 reference.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from .. import kernels
from ..runtime import Cluster
from ..collectives.ring import all_gather_ring, reduce_scatter_ring
from ..reference import layernorm_reference
from ..runtime import ship
from .feedback import Feedback, failed, multiple_choice, passed
from .harness import Spy, explain_error
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - notebook

FUSED_SOLUTION = """def my_fused(comm, x):
    pieces = np.array_split(x.copy(), comm.world_size, axis=0)   # whole rows; rank r owns piece r

    def add_and_normalise(acc, incoming):   # the last reduce-scatter step: add AND normalise
        return kernels.add_layernorm(acc, incoming, out=acc)

    reduce_scatter_ring(comm, pieces, "sum", last=add_and_normalise)
    # all-gather the normalised rows: every rank ends with all of them
    return np.concatenate(all_gather_ring(comm, pieces), axis=0)"""

_NORM_FUNCTIONS = ("layernorm", "rmsnorm", "add_layernorm", "sum_layernorm")
_PATCH_LOCK = threading.Lock()
_PATCH = {"users": 0, "originals": {}}
_COUNT = threading.local()  # .rows: rows this rank (thread) normalised while the learner's runs


def _rows(a) -> int:
    """Rows of an array normalised over its last axis (a 1-D array is one row)."""
    shape = np.shape(a)
    return int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1


def _counting(name, fn):
    def counted(*args, **kwargs):
        first = args[0] if args else next(iter(kwargs.values()), None)
        if hasattr(_COUNT, "rows"):
            _COUNT.rows += _rows(first[0] if name == "sum_layernorm" else first)
        return fn(*args, **kwargs)
    counted.__name__ = counted.__qualname__ = fn.__name__
    counted.__doc__ = fn.__doc__
    return counted


class _CountRows:
    """While active on this thread, rows normalised through kernels.* are counted (local ranks
    share the module)."""

    def __enter__(self):
        with _PATCH_LOCK:
            if _PATCH["users"] == 0:
                for name in _NORM_FUNCTIONS:
                    _PATCH["originals"][name] = getattr(kernels, name)
                    setattr(kernels, name, _counting(name, getattr(kernels, name)))
            _PATCH["users"] += 1
        _COUNT.rows = 0
        return self

    def __exit__(self, *exc):
        self.rows = _COUNT.rows
        del _COUNT.rows
        with _PATCH_LOCK:
            _PATCH["users"] -= 1
            if _PATCH["users"] == 0:
                for name, fn in _PATCH["originals"].items():
                    setattr(kernels, name, fn)


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


def _fused_on_rank(comm, blob: bytes, shape) -> dict:
    """On one rank: run the learner's function through a Spy, counting the rows it normalises."""
    import cloudpickle

    x = fused_input(comm.rank, shape)
    spy = _Shapes(comm)
    with _CountRows() as count:
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


def _fused_problem(reports, n: int, shape, sent: dict) -> str | None:
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


def _fused_explain(e: BaseException) -> str:
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


@exercise(
    "07.1", "fuse LayerNorm into the ring all-reduce", kind="code", function="my_fused",
    solution=FUSED_SOLUTION,
    needs={"kernels": kernels, "reduce_scatter_ring": reduce_scatter_ring,
           "all_gather_ring": all_gather_ring},
    explanation="""The sum and the norm are one pass over each rank's 1/N of the rows, and the bytes
are a ring all-reduce's. (A world of one rank has no ring steps, so `last` never runs: there, call
kernels.layernorm(x) instead.)""",
    hints=("Cut a copy of x by rows, one piece per rank: np.array_split(x.copy(), "
           "comm.world_size, axis=0). LayerNorm works on whole rows, so a row must never be split "
           "between ranks.",
           "reduce_scatter_ring(comm, pieces, \"sum\", last=...) runs the ring's reduce-scatter on "
           "your pieces and calls last(acc, incoming) in place of its final addition. Give it a "
           "function that adds and normalises at once: kernels.add_layernorm(acc, incoming, "
           "out=acc).",
           "After reduce-scatter each rank holds its own rows, normalised. all_gather_ring(comm, "
           "pieces) passes them around until every rank has all of them: return "
           "np.concatenate(all_gather_ring(comm, pieces), axis=0)."),
    key="""from allreduce_edu.exercises.lesson07 import check_fused, hint, solution

""" + FUSED_SOLUTION + """

check_fused(my_fused)""")
def check_fused(fn, world_sizes=(3, 4), shapes=((10, 16), (2, 8), (13, 24)), timeout: float = 20.0,
                transport: str = "grpc") -> Feedback:
    """Exercise 07.1: `fn(comm, x)` = LayerNorm(sum over ranks of x) on every rank, fused into a
    ring all-reduce.

    Runs on real gRPC ranks of each world size with uneven rows (and fewer rows than ranks), then
    checks the result against the float64 reference, the rows each rank normalised, and the bytes
    each rank sent.
    """
    blob = ship(fn, (), {})
    summary = {}
    for n in world_sizes:
        with Cluster(n, transport, timeout=timeout) as cluster:
            for shape in shapes:
                try:
                    reports = cluster.run(_fused_on_rank, blob, tuple(shape))
                except Exception as e:  # noqa: BLE001 - the learner's code: report, don't crash
                    return failed(f"{n} ranks: " + explain_error(e, shape, _fused_explain(e)))
                sent = cluster.trace.bytes_sent()
                problem = _fused_problem(reports, n, tuple(shape), sent)
                if problem:
                    return failed(f"{n} ranks, x of shape {tuple(shape)}: {problem}")
                summary[n, tuple(shape)] = (sent, [rep["rows"] for rep in reports])
    n, shape = max(world_sizes), max(shapes, key=lambda s: s[0] * s[1])
    sent, rows = summary[n, tuple(shape)]
    s = shape[0] * shape[1] * 4
    where = "gRPC" if transport == "grpc" else transport
    return passed(f"LayerNorm of the sum matches the float64 reference on "
                  f"{' and '.join(map(str, world_sizes))} {where} ranks, for x of shapes "
                  f"{', '.join(map(str, shapes))}. With {n} ranks and x of shape {shape} (S = {s} "
                  f"bytes) your ranks normalised {rows} rows and sent {sum(sent.values())} bytes "
                  f"in all = 2(N−1)·S, as a ring all-reduce does.")


@exercise(
    "07.2", "predict the root's bytes", kind="number",
    todo="replace None with the number of bytes rank 0 sends, then run this cell again.",
    hints=("Rank 0 is the root of the tree reduce, where it only receives. Count what it sends in "
           "the broadcast.",
           "A binomial broadcast doubles the number of ranks that hold the data every step: "
           "⌈log2 N⌉ steps, and in each one rank 0 sends the whole normalised tensor, S bytes."),
    solution="""In the root variant rank 0 sends nothing in the reduce (it only receives) and, in
the binomial broadcast, sends the whole normalised tensor once per step to a new rank: ⌈log2 N⌉
steps.
    N = 8: ⌈log2 8⌉ · S = 3 · 1048576 = 3145728 bytes   (3 MiB)
Compare the ring (fused or unfused): 2(N-1)/N · S = 1.75 MiB per rank.""",
    key="""from allreduce_edu.exercises.lesson07 import check_root_bytes, hint, solution

my_bytes = 3 * (1 << 20)   # ⌈log2 8⌉ = 3 broadcast steps of S; in the reduce rank 0 only receives
check_root_bytes(my_bytes)""")
def check_root_bytes(answer, world_size: int = 8, nbytes: int = 1 << 20) -> Feedback:
    """Exercise 07.2: bytes rank 0 sends in the root variant (tree reduce + broadcast) for N ranks,
    S bytes."""
    try:
        answer = float(answer)
    except (TypeError, ValueError):
        return failed("answer with a number of bytes.")
    n, s = world_size, nbytes
    steps = (n - 1).bit_length()
    expected = steps * s
    if answer == expected:
        return passed(f"{expected} bytes = ⌈log2 {n}⌉ · S = {steps} MiB: rank 0 only receives in "
                      f"the reduce, then sends the whole tensor once per broadcast step. A ring "
                      f"sends 2(N−1)/N·S = {2 * (n - 1) / n * s:.0f} per rank — less, but in "
                      f"{2 * (n - 1)} steps instead of {2 * steps}.")
    hints = {
        2 * (n - 1) / n * s: "that is what every rank sends in the ring (fused or unfused); the "
                             "root variant uses binomial trees.",
        (n - 1) * s: "that is a naive broadcast (rank 0 sends to each of the N − 1 others); the "
                     "binomial tree lets ranks that already hold the data pass it on, so rank 0 "
                     "sends once per step.",
        2 * (n - 1) * s: "that is what all ranks send together (2(N−1)·S); the question asks for "
                         "rank 0 alone.",
        2 * steps * s: "rank 0 is the root of the reduce: there it only receives. Count its "
                       "broadcast sends only.",
        s: "rank 0 sends in every broadcast step, not just once: the ranks that hold the data "
           "double each step.",
        steps: "that is the number of broadcast steps; each sends the whole tensor, S bytes: "
               "multiply by S.",
        steps * 1e6: "S = 1 MiB = 1048576 bytes, not 10^6.",
        steps * s * 8: "in bytes, not bits.",
    }
    for value, text in hints.items():
        if math.isclose(answer, value, rel_tol=1e-9):
            return failed(text)
    return failed(f"not it: the broadcast from rank 0 takes ⌈log2 N⌉ = {steps} steps, and in the "
                  f"reduce rank 0 only receives. How many bytes does rank 0 send per step?")


@exercise(
    "07.3", "why fusion saves memory passes", kind="choice",
    hints=("You counted the bytes: fused and unfused send exactly the same. The saving is not on "
           "the wire. Where does the summed row live between the reduction and the norm?",
           "Unfused, the all-reduce writes the sum to memory and LayerNorm reads it back, on every "
           "rank, for every row. Fused, one kernel adds and normalises while the row is still in "
           "cache — for how many of the rows?"),
    solution="""b: the fused kernel reads acc and incoming once, sums them into a row that stays in
cache for the mean and variance, and writes the normalised row once. Unfused, the sum is written to
memory by the all-reduce and read back (twice, by a two-pass NumPy norm) — and every rank does it
for every row, instead of 1/N of them. The bytes on the wire are the same (a).""",
    key="""from allreduce_edu.exercises.lesson07 import check_fusion_answer, hint, solution

check_fusion_answer("b")""")
def check_fusion_answer(choice: str) -> Feedback:
    """Exercise 07.3: why does fusing the norm into the reduce-scatter save memory passes?
    (a, b, c or d)"""
    answers = {
        "a": "no: you counted them — fused, unfused and the ring all-reduce send exactly the same "
             "bytes, 2(N−1)/N·S per rank. Fusion saves memory traffic and compute, not wire "
             "traffic.",
        "b": "",
        "c": "no: the number of passes has nothing to do with the dtype; the kernel keeps its "
             "statistics in float64 either way. Think about where the summed row lives between "
             "the reduction and the norm.",
        "d": "no: there is no GPU here; Numba compiles for the CPU. The saving is in reads and "
             "writes of memory.",
    }
    success = ("the fused kernel reads acc and incoming once, keeps the summed row in cache for "
               "the mean and the variance, and writes the normalised row once — the sum never "
               "makes a round trip through memory, and each rank touches 1/N of the rows.")
    return multiple_choice(choice, answers, right="b", success=success)
