"""Lesson 07 · fused reduce + LayerNorm + broadcast: write the fused variant on real ranks, count the root's bytes.

`check_fused` runs your `my_fused(comm, x)` on real gRPC ranks with uneven rows, counts the rows each rank
normalises through `allreduce_edu.kernels` (the checker wraps its norm functions on every rank while your
function runs) and the bytes each rank sends, and compares the result with the float64 reference.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from .. import kernels
from ..runtime import Cluster
from ..reference import layernorm_reference
from ..runtime import ship
from .feedback import Feedback, failed, multiple_choice, passed  # noqa: F401
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - for the notebook

SOLUTIONS: dict[str, str] = {}  # TODO(issue 10): move into @exercise registrations
from .harness import Spy, explain_error

SOLUTIONS["07.1"] = """from allreduce_edu import kernels
from allreduce_edu.collectives.ring import all_gather_ring, reduce_scatter_ring

def my_fused(comm, x):
    pieces = np.array_split(x.copy(), comm.world_size, axis=0)   # whole rows: rank r will own piece r
    # reduce-scatter; its last step adds the incoming partial sum AND normalises, in one pass over my rows
    reduce_scatter_ring(comm, pieces, "sum",
                        last=lambda acc, incoming: kernels.add_layernorm(acc, incoming, out=acc))
    # all-gather the normalised rows: every rank ends with all of them
    return np.concatenate(all_gather_ring(comm, pieces), axis=0)
(A world of one rank has no ring steps, so `last` never runs: there, call kernels.layernorm(x) instead.)"""

SOLUTIONS["07.2"] = """In the root variant rank 0 sends nothing in the reduce (it only receives) and, in the binomial
broadcast, sends the whole normalised tensor once per step to a new rank: ⌈log2 N⌉ steps.
    N = 8: ⌈log2 8⌉ · S = 3 · 1048576 = 3145728 bytes   (3 MiB)
Compare the ring (fused or unfused): 2(N-1)/N · S = 1.75 MiB per rank."""

SOLUTIONS["07.3"] = """b: the fused kernel reads acc and incoming once, sums them into a row that stays in cache for the
mean and variance, and writes the normalised row once. Unfused, the sum is written to memory by the all-reduce
and read back (twice, by a two-pass NumPy norm) — and every rank does it for every row, instead of 1/N of them.
The bytes on the wire are the same (a)."""

_NORM_FUNCTIONS = ("layernorm", "rmsnorm", "add_layernorm", "sum_layernorm")
_PATCH_LOCK = threading.Lock()
_PATCH = {"users": 0, "originals": {}}
_COUNT = threading.local()  # .rows: rows this rank (thread) normalised while the learner's function runs


def _rows(a) -> int:
    """Rows of an array normalised over its last axis (a 1-D array is one row)."""
    shape = np.shape(a)
    return int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1


def _counting(name, fn):
    def counted(*args, **kwargs):
        first = args[0] if args else next(iter(kwargs.values()))
        if hasattr(_COUNT, "rows"):
            _COUNT.rows += _rows(first[0] if name == "sum_layernorm" else first)
        return fn(*args, **kwargs)
    counted.__name__ = counted.__qualname__ = fn.__name__
    counted.__doc__ = fn.__doc__
    return counted


class _CountRows:
    """While active on this thread, rows normalised through kernels.* are counted (local ranks share the module)."""

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


def fused_input(rank: int, shape, seed: int = 7) -> np.ndarray:
    """Rank r's partial activation for the checker: float32, with an offset so LayerNorm has a mean to remove."""
    return (np.random.default_rng([seed, rank]).standard_normal(shape) + 2.0 + rank).astype(np.float32)


def _fused_on_rank(comm, blob: bytes, shape) -> dict:
    """On one rank: run the learner's function through a Spy, counting the rows it normalises."""
    import cloudpickle

    x = fused_input(comm.rank, shape)
    spy = Spy(comm, ("send", "recv", "sendrecv"))
    with _CountRows() as count:
        fn = cloudpickle.loads(blob)[0]  # after patching: names imported from kernels resolve to the counters
        y = fn(spy, x)
    return {"y": None if y is None else np.asarray(y), "rows": count.rows,
            "modified": not np.array_equal(x, fused_input(comm.rank, shape)),
            "message_bytes": [s[1] for s in spy.sends]}


def _reference(n: int, shape) -> np.ndarray:
    return layernorm_reference(sum(fused_input(r, shape).astype(np.float64) for r in range(n)))


def _close(y, ref) -> bool:
    return y.shape == ref.shape and bool(np.all(np.abs(y.astype(np.float64) - ref) <= 1e-4 * max(1.0, np.abs(ref).max())))


def _fused_problem(reports, n: int, shape, sent: dict) -> str | None:
    """The first thing wrong with a fused reduce + LayerNorm + broadcast: results, input, rows, bytes."""
    rows, hidden = shape
    row_bytes = hidden * 4
    ref = _reference(n, shape)
    owned = [len(p) for p in np.array_split(np.empty(rows), n)]  # rows of each rank's piece
    for r, rep in enumerate(reports):
        y = rep["y"]
        if y is None:
            return (f"rank {r} returned None: return every normalised row, "
                    f"np.concatenate(all_gather_ring(comm, pieces), axis=0).")
        if y.dtype == object or y.dtype.kind not in "f":
            return f"rank {r} returned a {y.dtype} array: return the float32 rows."
        if y.shape != ref.shape:
            if y.ndim == 2 and y.shape[1] == hidden and y.shape[0] == owned[r] != rows:
                return (f"rank {r} returned only its own {owned[r]} of {rows} rows: after reduce-scatter, "
                        f"all-gather the normalised pieces so every rank holds all rows (all_gather_ring).")
            return f"rank {r} returned shape {y.shape}, but x has shape {shape}: return an array of x's shape."
    for r, rep in enumerate(reports):
        if rep["modified"]:
            return (f"rank {r}'s input x changed: np.array_split(x, N, axis=0) returns views of x, so the reduction "
                    f"writes into the caller's array. Split a copy: np.array_split(x.copy(), N, axis=0).")
    for r, rep in enumerate(reports):
        if _close(rep["y"], ref):
            continue
        split = [b for b in rep["message_bytes"] if b % row_bytes]
        if split:
            return (f"rank {r} sent a message of {split[0]} bytes, not a whole number of rows ({row_bytes} bytes "
                    f"each), and its result is wrong: LayerNorm needs whole rows on one rank. Split by rows, "
                    f"np.array_split(x.copy(), N, axis=0), not x.reshape(-1).")
        total = sum(fused_input(q, shape).astype(np.float64) for q in range(n))
        if np.allclose(rep["y"], total, rtol=1e-4, atol=1e-4):
            return (f"rank {r} holds the sum of the ranks' x, not normalised: pass last=... to reduce_scatter_ring "
                    f"so its last step calls kernels.add_layernorm.")
        lo = sum(owned[:r])
        mine = slice(lo, lo + owned[r])
        if owned[r] and _close(rep["y"][mine], layernorm_reference(fused_input(r, shape)[mine])):
            return (f"rank {r}'s own rows {lo}..{lo + owned[r] - 1} are LayerNorm of rank {r}'s x alone: the last "
                    f"step must add what arrives too — norm(acc + incoming): kernels.add_layernorm(acc, incoming).")
        bad = np.flatnonzero(np.any(np.abs(rep["y"] - ref) > 1e-4 * max(1.0, np.abs(ref).max()), axis=1))
        return (f"rank {r}'s row {bad[0]} differs from LayerNorm(sum over ranks of x) (float64 reference) by up to "
                f"{np.abs(rep['y'][bad[0]] - ref[bad[0]]).max():.2g}: check what your last step adds and normalises.")
    counts = [rep["rows"] for rep in reports]
    if sum(counts) == 0:
        return ("the checker saw no rows normalised through allreduce_edu.kernels: normalise with "
                "kernels.add_layernorm in reduce-scatter's last step (last=...), so the sum and the norm are one pass.")
    if rows and all(c >= rows for c in counts):
        return (f"you normalised all rows on every rank (rows normalised per rank: {counts}) — that is the unfused "
                f"variant. Normalise only the rows you own, in reduce-scatter's last step, then all-gather them.")
    if rows and counts[0] >= rows and not any(counts[1:]):
        return (f"only rank 0 normalised, all {rows} rows — that is the root variant. In the fused variant every "
                f"rank normalises the rows it owns after reduce-scatter (about rows/N each).")
    if sum(counts) > rows:
        return (f"{sum(counts)} rows were normalised for {rows} rows in all (per rank: {counts}): normalise each "
                f"row once, on the rank that owns it — inside the last reduce-scatter step, not again afterwards.")
    if max(counts) > math.ceil(rows / n):
        return (f"ranks normalised {counts} rows: the work should be spread evenly, at most ⌈rows/N⌉ = "
                f"{math.ceil(rows / n)} each (np.array_split(x, N, axis=0) gives every rank its share).")
    s = rows * hidden * 4
    ring_total = 2 * (n - 1) * s
    limit = 2 * (n - 1) * math.ceil(rows / n) * row_bytes
    for r in range(n):
        if sent.get(r, 0) > limit:
            return (f"rank {r} sent {sent.get(r, 0)} bytes; a ring all-reduce sends 2(N−1)/N·S = "
                    f"{2 * (n - 1) * s / n:.0f} per rank (S = {s}): pass pieces of 1/N of the rows around the ring.")
    if sum(sent.values()) != ring_total:
        return (f"your ranks sent {sum(sent.values())} bytes in all; a ring all-reduce of S = {s} bytes sends "
                f"2(N−1)·S = {ring_total}: N − 1 reduce-scatter and N − 1 all-gather steps of S/N per rank.")
    return None


def check_fused(fn, world_sizes=(3, 4), shapes=((10, 16), (2, 8), (13, 24)), timeout: float = 20.0,
                transport: str = "grpc") -> Feedback:
    """Exercise 07.1: `fn(comm, x)` = LayerNorm(sum over ranks of x) on every rank, fused into a ring all-reduce.

    Runs on real gRPC ranks of each world size with uneven rows (and fewer rows than ranks), then checks the
    result against the float64 reference, the rows each rank normalised, and the bytes each rank sent.
    """
    blob = ship(fn, (), {})
    summary = {}
    for n in world_sizes:
        with Cluster(n, transport, timeout=timeout) as cluster:
            for shape in shapes:
                try:
                    reports = cluster.run(_fused_on_rank, blob, tuple(shape))
                except Exception as e:  # noqa: BLE001 - the learner's code: report, don't crash
                    hint = ("reduce_scatter_ring and all_gather_ring take the list of N pieces, and every rank "
                            "must call both") if "never came" in str(e) or "deadline" in str(e) else None
                    return failed(f"{n} ranks: " + explain_error(e, shape, hint))
                sent = cluster.trace.bytes_sent()
                problem = _fused_problem(reports, n, tuple(shape), sent)
                if problem:
                    return failed(f"{n} ranks, x of shape {tuple(shape)}: {problem}")
                summary[n, tuple(shape)] = (sent, [rep["rows"] for rep in reports])
    n, shape = max(world_sizes), max(shapes, key=lambda s: s[0] * s[1])
    sent, rows = summary[n, tuple(shape)]
    s = shape[0] * shape[1] * 4
    where = "gRPC" if transport == "grpc" else transport
    return passed(f"LayerNorm of the sum matches the float64 reference on {' and '.join(map(str, world_sizes))} "
                  f"{where} ranks, for x of shapes {', '.join(map(str, shapes))}. With {n} ranks and x of shape "
                  f"{shape} (S = {s} bytes) your ranks normalised {rows} rows and sent {sum(sent.values())} bytes "
                  f"in all = 2(N−1)·S, as a ring all-reduce does.")


def check_root_bytes(answer, world_size: int = 8, nbytes: int = 1 << 20) -> Feedback:
    """Exercise 07.2: bytes rank 0 sends in the root variant (tree reduce + broadcast) for N ranks, S bytes."""
    try:
        answer = float(answer)
    except (TypeError, ValueError):
        return failed("answer with a number of bytes.")
    n, s = world_size, nbytes
    steps = (n - 1).bit_length()
    expected = steps * s
    if answer == expected:
        return passed(f"{expected} bytes = ⌈log2 {n}⌉ · S = {steps} MiB: rank 0 only receives in the reduce, then "
                      f"sends the whole tensor once per broadcast step. A ring sends 2(N−1)/N·S = "
                      f"{2 * (n - 1) / n * s:.0f} per rank — less, but in {2 * (n - 1)} steps instead of "
                      f"{2 * steps}.")
    hints = {
        2 * (n - 1) / n * s: "that is what every rank sends in the ring (fused or unfused); the root variant uses "
                             "binomial trees.",
        (n - 1) * s: "that is a naive broadcast (rank 0 sends to each of the N − 1 others); the binomial tree lets "
                     "ranks that already hold the data pass it on, so rank 0 sends once per step.",
        2 * (n - 1) * s: "that is what all ranks send together (2(N−1)·S); the question asks for rank 0 alone.",
        2 * steps * s: "rank 0 is the root of the reduce: there it only receives. Count its broadcast sends only.",
        s: "rank 0 sends in every broadcast step, not just once: the ranks that hold the data double each step.",
        steps: "that is the number of broadcast steps; each sends the whole tensor, S bytes: multiply by S.",
        steps * 1e6: "S = 1 MiB = 1048576 bytes, not 10^6.",
        steps * s * 8: "in bytes, not bits.",
    }
    for value, hint in hints.items():
        if math.isclose(answer, value, rel_tol=1e-9):
            return failed(hint)
    return failed(f"not it: the broadcast from rank 0 takes ⌈log2 N⌉ = {steps} steps, and in the reduce rank 0 "
                  f"only receives. How many bytes does rank 0 send per step?")


def check_fusion_answer(choice: str) -> Feedback:
    """Exercise 07.3: why does fusing the norm into the reduce-scatter save memory passes? (a, b, c or d)"""
    answers = {
        "a": "no: you counted them — fused, unfused and the ring all-reduce send exactly the same bytes, "
             "2(N−1)/N·S per rank. Fusion saves memory traffic and compute, not wire traffic.",
        "b": "",
        "c": "no: the number of passes has nothing to do with the dtype; the kernel keeps its statistics in float64 "
             "either way. Think about where the summed row lives between the reduction and the norm.",
        "d": "no: there is no GPU here; Numba compiles for the CPU. The saving is in reads and writes of memory.",
    }
    success = ("the fused kernel reads acc and incoming once, keeps the summed row in cache for the mean and "
               "the variance, and writes the normalised row once — the sum never makes a round trip through "
               "memory, and each rank touches 1/N of the rows.")
    return multiple_choice(choice, answers, right="b", success=success)
