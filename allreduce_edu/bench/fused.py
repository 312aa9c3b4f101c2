"""Benchmark of Reduce + LayerNorm + Broadcast: time, bytes on the wire, rows normalised per rank.
Lesson 07.

Each (rows, hidden) size runs a plain ring all-reduce of the same tensor, then the unfused, root
and fused variants; every result is checked against the float64 reference. The α-β-γ model
(costmodel.py) with a δ for normalising says where the differences grow: fast wires, many ranks.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import time

import numpy as np

from .. import kernels
from ..collectives import allreduce
from ..collectives.fused import reduce_layernorm_broadcast
from ..kernels.reference import layernorm_reference
from ..model.costmodel import NORM_VARIANTS, fit_alpha_beta, predict_norm
from ..runtime import Cluster
from .allreduce import format_p2p, pingpong, slowest
from .kernels import format_kernel_table, kernel_bench

ROWS = NORM_VARIANTS  # the order of the table: the bare ring all-reduce, then the variants
RING = ROWS[0]
TOL = {"float32": 1e-3, "float64": 1e-9}  # relative to the largest |reference| value


def partial(rank: int, rows: int, hidden: int, dtype, seed: int = 0) -> np.ndarray:
    """Rank r's partial activation (rows, hidden), as a row-parallel matmul would leave it."""
    return np.random.default_rng([seed, rank]).standard_normal((rows, hidden), dtype=dtype)


def affine(hidden: int, dtype, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """gamma and beta, the same on every rank."""
    rng = np.random.default_rng([seed, 1 << 20])
    return (rng.random(hidden) + 0.5).astype(dtype), rng.standard_normal(hidden).astype(dtype)


def _check(y, ref, dtype) -> tuple[int, float]:
    """(#wrong, max relative error): elements off by more than TOL · max|ref|."""
    if ref.size == 0:
        return 0, 0.0
    scale = max(float(np.abs(ref).max()), np.finfo(np.float64).tiny)
    err = np.abs(y.astype(np.float64) - ref)
    return int(np.count_nonzero(err > TOL[dtype] * scale)), float(err.max() / scale)


def _call(comm, variant, x, gamma, beta, stats):
    if variant == RING:
        return allreduce(comm, x, "sum", algorithm="ring")
    return reduce_layernorm_broadcast(comm, x, gamma, beta, variant=variant, stats=stats)


def measure(comm, sizes, dtype="float32", iters=10, warmup=2, budget=4.0, seed=0) -> list[dict]:
    """Run on every rank: per (rows, hidden) and variant, per-iteration wall and CPU times (every
    thread of this process: gRPC's too), bytes sent and rows normalised.

    Rounds interleave the variants (a noisy neighbour slows them alike). The first `warmup`
    rounds (at least one) are not timed: the first compiles, and the first few make the
    shared-memory segments each link sends from (lesson 10), so they are slow. Warm-up stops early
    where another round as long as the last would take it past half of `budget` seconds; timed
    rounds stop (after no fewer than 3) where another would take them past `budget`. So it all
    takes about 1.5 × `budget` at most, past the first round. The ranks decide both on the slowest
    rank's time.
    """
    out = []
    for rows, hidden in sizes:
        x = partial(comm.rank, rows, hidden, dtype, seed)  # (rows, hidden)
        gamma, beta = affine(hidden, dtype, seed)
        total = ref = None
        if comm.rank == 0:  # the float64 reference, from every rank's partial
            total = sum(partial(r, rows, hidden, dtype, seed).astype(np.float64)
                        for r in range(comm.world_size))
            ref = layernorm_reference(total, gamma, beta)
        stats = {v: {} for v in ROWS}
        calls = {v: functools.partial(_call, comm, v, x, gamma, beta, stats[v]) for v in ROWS}
        started, spent = time.perf_counter(), 0.0
        for n in range(1, max(warmup, 1) + 1):  # compile, fault pages in, grow the segment pools
            for call in calls.values():
                call()
            if n < warmup:  # would another round, as long as this one, pass half the budget?
                spent, last = slowest(comm, time.perf_counter() - started), spent
                if 2 * spent - last > budget / 2:
                    break
        times, cpu, sent, y = {v: [] for v in ROWS}, {v: [] for v in ROWS}, {}, {}
        started = time.perf_counter()
        for n in range(1, iters + 1):
            for v, call in calls.items():
                comm.barrier()  # start together: the time is the slowest rank's
                k = len(comm.trace.events)
                t0, c0 = time.perf_counter(), time.process_time()
                y[v] = call()
                times[v].append(time.perf_counter() - t0)
                cpu[v].append(time.process_time() - c0)
                # one call, exact
                sent[v] = sum(e.nbytes for e in comm.trace.events[k:] if e.src == comm.rank)
            elapsed = time.perf_counter() - started
            if 3 <= n < iters and slowest(comm, elapsed) / n * (n + 1) > budget:
                break  # one more round would not fit
        for v in ROWS:
            wrong, err = (_check(y[v], total if v == RING else ref, dtype) if comm.rank == 0
                          else (0, 0.0))
            out.append({"variant": v, "rows": rows, "hidden": hidden, "dtype": np.dtype(dtype).name,
                        "world_size": comm.world_size, "bytes": x.nbytes, "times": times[v],
                        "cpu": cpu[v], "sent": sent[v],
                        "norm_rows": stats[v].get("rows_normalised", 0), "wrong": wrong,
                        "max_rel_err": err,
                        "digest": hashlib.blake2b(np.ascontiguousarray(y[v]).data,
                                                  digest_size=16).hexdigest(),
                        "elements": y[v].size})
    return out


def measure_all(cluster, rows=(256, 1024, 4096), hidden=(1024, 4096), dtype="float32", iters=10,
                warmup=2, budget=4.0) -> list[dict]:
    """Every (rows, hidden, variant) on `cluster`, combined over ranks: time is the median over
    iterations of the slowest rank, cpu the median of all ranks' CPU seconds (gRPC ranks only:
    local ranks share one process); a rank whose result differs from rank 0's bits counts all
    its elements as wrong."""
    if np.dtype(dtype) not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64 for LayerNorm, got {dtype}")
    if iters < 1 or min(rows, default=0) < 0 or min(hidden, default=0) < 1:
        raise ValueError(f"need iters >= 1, rows >= 0 and hidden >= 1, "
                         f"got {iters}, {rows}, {hidden}")
    per_rank = cluster.run(measure, list(itertools.product(rows, hidden)), dtype, iters, warmup,
                           budget)
    table = []
    for by_rank in zip(*per_rank, strict=True):
        r0 = by_rank[0]
        row = {k: r0[k] for k in ("variant", "rows", "hidden", "dtype", "world_size", "bytes",
                                  "max_rel_err")}
        row["time_us"] = float(np.median(np.max([r["times"] for r in by_rank], axis=0))) * 1e6
        row["iters"] = len(r0["times"])
        processes = cluster.transport != "local"
        row["cpu_us"] = (float(np.median(np.sum([r["cpu"] for r in by_rank], axis=0))) * 1e6
                         if processes else None)
        row["sent_max"] = max(r["sent"] for r in by_rank)
        row["sent_total"] = sum(r["sent"] for r in by_rank)
        row["norm_rows_max"] = max(r["norm_rows"] for r in by_rank)
        row["norm_rows_total"] = sum(r["norm_rows"] for r in by_rank)
        row["wrong"] = r0["wrong"] + sum(r["elements"] for r in by_rank
                                         if r["digest"] != r0["digest"])
        table.append(row)
    for row in table:  # time relative to the ring all-reduce of the same tensor
        ring = next(r for r in table
                    if (r["rows"], r["hidden"], r["variant"]) == (row["rows"], row["hidden"], RING))
        row["vs_ring"] = row["time_us"] / ring["time_us"]
        row["cpu_vs_ring"] = row["cpu_us"] / ring["cpu_us"] if row["cpu_us"] is not None else None
    return table


def format_table(rows: list[dict]) -> str:
    """One line per (size, variant): time and CPU (× ring all-reduce), bytes sent, rows normalised,
    errors."""
    lines = [(f"#{'rows':>6} {'hidden':>6} {'type':>8} {'variant':>15} {'time':>10} {'vs':>6} "
              f"{'cpu':>10} {'vs':>6} {'sent/rank':>11} {'sent total':>11} {'norm rows/rank':>14} "
              f"{'norm rows':>9} {'max rel err':>11} {'#wrong':>6}"),
             (f"#{'':>6} {'':>6} {'':>8} {'':>15} {'(us)':>10} {'ring':>6} {'(us, all)':>10} "
              f"{'ring':>6} {'(B, max)':>11} {'(B)':>11} {'(max)':>14} {'(total)':>9} {'':>11} "
              f"{'':>6}")]
    for r in rows:
        cpu = (("-", "-") if r["cpu_us"] is None
               else (f"{r['cpu_us']:.1f}", f"{r['cpu_vs_ring']:.2f}"))
        lines.append(f" {r['rows']:>6} {r['hidden']:>6} {r['dtype']:>8} {r['variant']:>15} "
                     f"{r['time_us']:>10.1f} {r['vs_ring']:>6.2f} {cpu[0]:>10} {cpu[1]:>6} "
                     f"{r['sent_max']:>11} {r['sent_total']:>11} {r['norm_rows_max']:>14} "
                     f"{r['norm_rows_total']:>9} {r['max_rel_err']:>11.1e} {r['wrong']:>6}")
    lines.append("# time: median over iterations of the slowest rank; cpu: median CPU time of all "
                 "rank processes together (gRPC threads included)")
    return "\n".join(lines)


# ---- the α-β-γ(-δ) model: where does fusing the norm into the all-reduce matter? ----

def machine_gamma_delta(rows=4096, hidden=4096, dtype="float32", repeat=5) -> tuple[float, float]:
    """γ (NumPy acc += x) and δ (Numba layernorm) on this machine, in seconds per byte of the
    tensor."""

    x = partial(0, rows, hidden, dtype)
    acc, out = x.copy(), np.empty_like(x)
    gamma, beta = affine(hidden, dtype)
    samples = {"add": [], "norm": []}
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        np.add(acc, x, out=acc)
        t1 = time.perf_counter()
        kernels.layernorm(x, gamma, beta, out=out)
        samples["add"].append(t1 - t0)
        samples["norm"].append(time.perf_counter() - t1)
    return (float(np.median(samples["add"][1:])) / x.nbytes,
            float(np.median(samples["norm"][1:])) / x.nbytes)


#: a GPU node on NVLink, assumed for illustration: α 10 µs, 400 GB/s busbw, HBM at 3 TB/s
#: (γ moves 3 bytes per byte reduced, δ moves 2 per byte normalised)
GPU_NODE = {"alpha": 10e-6, "beta": 1 / 400e9, "gamma": 3 / 3e12, "delta": 2 / 3e12}


def format_model(scenarios: dict, world_sizes=(4, 8), shapes=((4096, 4096), (16, 4096)),
                 itemsize=4) -> str:
    """Predicted time of each variant, as a multiple of the ring all-reduce, per scenario, N and
    (rows, hidden)."""
    lines = ["# α-β-γ-δ model: predicted time / ring all-reduce time "
             "(fused < unfused < root when bandwidth-bound)",
             f"#{'scenario':>34} {'N':>3} {'rows':>6} {'hidden':>6} {'ring (us)':>11} "
             + " ".join(f"{v:>8}" for v in ROWS[1:])]
    for name, p in scenarios.items():
        for n, (rows, hidden) in itertools.product(world_sizes, shapes):
            s = rows * hidden * itemsize
            t = {v: predict_norm(v, n, s, p["alpha"], p["beta"], p["gamma"], p["delta"])
                 for v in ROWS}
            lines.append(f" {name:>34} {n:>3} {rows:>6} {hidden:>6} {t[RING] * 1e6:>11.1f} "
                         + " ".join(f"{t[v] / t[RING]:>8.3f}" for v in ROWS[1:]))
    lines.append("# ring steps 2(N-1), tree steps 2⌈log2 N⌉ (N=8: 14 vs 6): "
                 "root wins only when α dominates")
    lines.append("# the model gives every rank its own link; ranks sharing one machine's cores pay "
                 "for the total bytes sent, 2(N-1)·S for ring, fused and root alike "
                 "('sent total'), so there they tie")
    return "\n".join(lines)


def report(world_size=4, transport="grpc", rows=(256, 1024, 4096), hidden=(1024, 4096),
           dtype="float32", iters=10, warmup=2, budget=4.0, kernels_too=True) -> int:
    """`allreduce-edu bench --op layernorm`: print the variants table, the kernel table and the
    model; 1 if wrong."""

    with Cluster(world_size, transport=transport) as cluster:
        print(f"# allreduce-edu bench --op layernorm: {world_size} ranks over {transport}, "
              f"dtype {dtype}, iters <= {iters} (median, slowest rank), warmup <= {warmup}",
              flush=True)
        points = cluster.run(pingpong)[0] if world_size >= 2 else []
        table = measure_all(cluster, rows, hidden, dtype, iters, warmup, budget)
    print(format_p2p({"alpha_us": points[0][1] * 1e6, "points": points,
                      "bandwidth_gbps": points[-1][0] / points[-1][1] / 1e9} if points else {}))
    print(format_table(table))
    big = max(rows), max(hidden)
    if kernels_too:
        print(f"\n# norm kernels on one process, ({big[0]}, {big[1]}) {dtype}")
        print(format_kernel_table(kernel_bench(*big, dtype=dtype, repeat=5)))
    scenarios = {"GPU node, NVLink (assumed)": GPU_NODE}
    if points:
        alpha, beta = fit_alpha_beta(*zip(*points, strict=True))
        gamma, delta = machine_gamma_delta(*big, dtype=dtype)
        fitted = {"alpha": alpha, "beta": beta, "gamma": gamma, "delta": delta}
        scenarios = {f"this machine, {transport} (fitted)": fitted, **scenarios}
    print()
    print(format_model(scenarios, itemsize=np.dtype(dtype).itemsize))
    wrong = sum(r["wrong"] for r in table)
    print(f"# out of bounds values: {wrong} {'OK' if not wrong else 'FAILED'}")
    return 1 if wrong else 0
