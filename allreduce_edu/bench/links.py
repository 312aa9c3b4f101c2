"""Measured against the model on emulated links: the links' own α, β and α, β fitted on the
testbed itself. Lessons 02-05, 07; `allreduce-edu bench --testbed`.

The links' own α, β are what the emulation charges; the fitted ones add what the transport costs
per message on top (copies, doorbells, 2 cores shared by every rank), measured the way a ring step
loads the machine: every rank sending to its right neighbour and receiving from its left at once.
Where the two models differ, the gap is the transport's own cost.
"""

from __future__ import annotations

import time

import numpy as np

from ..model.costmodel import fit_alpha_beta, predict_on_links
from ..model.links import Links
from .allreduce import combine, measure

FIT_SIZES = (0, 64 << 10, 1 << 20)


def exchange_times(comm, sizes=FIT_SIZES, steps: int = 6, reps: int = 3) -> list[list[float]]:
    """Run on every rank: per size, `reps` times the seconds per step of `steps` ring-neighbour
    exchanges in a row (every rank sends S to the right while it receives S from the left, as in
    a ring's step), after a barrier."""
    right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
    out = []
    for size in sizes:
        x, times = np.zeros(size, np.uint8), []
        for _ in range(reps):
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(steps):
                comm.sendrecv(right, x, left, "fit")
            times.append((time.perf_counter() - t0) / steps)
        out.append(times)
    return out


def fit(cluster, sizes=FIT_SIZES, steps: int = 6, reps: int = 3) -> Links:
    """α and β fitted on `cluster` itself: flat links that include the transport's own cost."""
    per_rank = np.array(cluster.run(exchange_times, list(sizes), steps, reps))  # (rank, size, rep)
    seconds = np.median(per_rank.max(axis=0), axis=1)  # the slowest rank, the median rep
    alpha, beta = fit_alpha_beta(sizes, seconds)
    return Links.flat(alpha, 1 / beta if beta > 0 else float("inf"))


def compare(cluster, algorithms, sizes, dtype="float32", iters: int = 3, warmup: int = 1,
            fitted: Links | None = None) -> list[dict]:
    """Every (algorithm, size) timed on `cluster` (alone, as the model times one all-reduce),
    beside the model on the cluster's own links ("model_us") and on `fitted` ("fit_us")."""
    rows = combine(cluster.run(measure, list(algorithms), list(sizes), dtype, iters, warmup))
    for row in rows:
        for key, links in (("model_us", cluster.links), ("fit_us", fitted)):
            seconds = None if links is None else predict_on_links(
                row["algorithm"], row["world_size"], row["bytes"], links)
            row[key] = None if seconds is None else seconds * 1e6
    return rows


def format_comparison(rows: list[dict]) -> str:
    """One line per row: measured, the links' model, the fitted model (when there is one),
    measured ÷ each."""
    fits = any(r.get("fit_us") for r in rows)
    lines = [f"{'algorithm':>19} {'N':>3} {'size':>9} {'measured':>10} {'model':>10} "
             f"{'÷ model':>8}" + (f" {'fitted':>10} {'÷ fitted':>9}" if fits else "")]
    for r in rows:
        model, fitted = r.get("model_us"), r.get("fit_us")
        lines.append(
            f"{r['algorithm']:>19} {r['world_size']:>3} {_size(r['bytes']):>9} "
            f"{r['time_us'] / 1e3:>7.1f} ms "
            + (f"{model / 1e3:>7.1f} ms {r['time_us'] / model:>8.2f}" if model else f"{'-':>19}")
            + (f" {fitted / 1e3:>7.1f} ms {r['time_us'] / fitted:>9.2f}" if fitted else ""))
    return "\n".join(lines)


def _size(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):g} {unit}"
    return f"{nbytes} B"
