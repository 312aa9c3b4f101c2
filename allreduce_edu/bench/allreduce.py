"""nccl-tests style all-reduce benchmark: size, count, type, time, algbw, busbw, #wrong. Lesson 03.

algbw = S / t; busbw = algbw · 2(N-1)/N, the bandwidth each link must carry, so numbers are
comparable across world sizes and against the wire's own bandwidth (nccl-tests,
doc/PERFORMANCE.md).
"""

from __future__ import annotations

import json
import re
import time

import numpy as np

from ..collectives import allreduce
from ..model.costmodel import bus_factor, fit_alpha_beta, predict_on_links
from ..runtime.engines import ENGINES, run_on_engine
from .floor import contract_us, pinned_floors, pipe_one_way_us, window_one_way

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def slowest(comm, seconds: float) -> float:
    """The largest of every rank's `seconds`, on every rank: what ranks that must decide alike
    (how many rounds fit the budget) decide on."""
    return float(allreduce(comm, np.array([seconds]), "max", "ring")[0])


def parse_size(text: str | int) -> int:
    """'8' -> 8, '64K' -> 65536, '64M' -> 67108864 (binary units, as nccl-tests)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"cannot read size {text!r}; write e.g. 8, 64K, 4M")
    return int(m[1]) * _UNITS[m[2].upper()]


def sweep(begin: int, end: int, factor: int) -> list[int]:
    """Sizes begin, begin·factor, ... up to end (inclusive), like nccl-tests' -b/-e/-f."""
    if begin < 0 or end < begin or factor < 2:
        raise ValueError(f"need 0 <= begin <= end and factor >= 2, got {begin}, {end}, {factor}")
    sizes, size = [], begin
    while size <= end:
        sizes.append(size)
        size = size * factor if size else 1
    return sizes


def pattern(rank: int, count: int, dtype) -> np.ndarray:
    """Rank r's test data: small integers, so float sums are exact and #wrong means really wrong.
    r + 1, ..., r + 7 over and over: one period, tiled."""
    return _repeat((np.arange(7) + rank + 1).astype(dtype), count)


def expected(world_size: int, count: int, dtype) -> np.ndarray:
    """The sum of every rank's pattern: N·(i mod 7) + N(N + 1)/2 at element i."""
    n = world_size
    return _repeat((n * np.arange(7) + n * (n + 1) // 2).astype(np.float64).astype(dtype), count)


def _repeat(period: np.ndarray, count: int) -> np.ndarray:
    """`period` over and over, `count` elements (np.tile copies whole blocks; np.resize, which says
    the same, is 40 times slower at 48 MiB)."""
    return np.tile(period, -(-count // len(period)))[:count]


def measure(comm, algorithms, sizes, dtype="float32", iters=20, warmup=5, budget=2.0,
            alone: bool | None = None) -> list[dict]:
    """Run on every rank: time `iters` all-reduces per (algorithm, size); all ranks agree on
    the count.

    The number of timed iterations is cut (to no fewer than 3) when `iters` would take over
    `budget` seconds. Back to back by default, as nccl-tests times them; `alone` (the default on
    emulated links, where times are compared with the model's one all-reduce) times each after a
    barrier, so one all-reduce's tail never overlaps the next one's start.
    """
    alone = comm.links is not None if alone is None else alone
    rows, itemsize = [], np.dtype(dtype).itemsize
    for algorithm in algorithms:
        for size in sizes:
            count = size // itemsize
            x = pattern(comm.rank, count, dtype)
            run_once = _allreduce_for(comm, algorithm)
            t0 = time.perf_counter()
            for _ in range(warmup):
                run_once(x)
            per_iter = slowest(comm, (time.perf_counter() - t0) / max(warmup, 1))
            n = int(min(iters, max(3, budget // max(per_iter, 1e-9)))) if iters > 3 else iters
            times = []
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(n):
                if alone:
                    comm.barrier()
                    t0 = time.perf_counter()
                y = run_once(x)
                if alone:
                    times.append(time.perf_counter() - t0)
            seconds = (time.perf_counter() - t0) / n if not alone else float(np.median(times))
            wrong = int(np.count_nonzero(y != expected(comm.world_size, count, dtype)))
            rows.append({"algorithm": algorithm, "world_size": comm.world_size,
                         "bytes": count * itemsize, "count": count, "dtype": np.dtype(dtype).name,
                         "time_us": seconds * 1e6, "wrong": wrong, "iters": n,
                         **({"iter_us": [t * 1e6 for t in times]} if alone else {})})
    return rows


def _allreduce_for(comm, algorithm: str):
    """Our algorithm by name, or the engine's own all-reduce when `algorithm` names the engine
    under `comm`."""
    # "gloo" on a TorchCommunicator, "mpi" on an MPICommunicator
    if comm.engine and algorithm == comm.engine:
        return comm.builtin_allreduce
    return lambda x: allreduce(comm, x, "sum", algorithm)


def latency(comm, nbytes: int = 8, iters: int = 100, untimed: int = 5) -> list[float]:
    """Rank 0 and 1 bounce `nbytes` `iters` times (after `untimed` more); returns the one-way
    seconds (half of each round trip), for percentiles: a message's cost is a distribution."""
    x, out = np.zeros(nbytes, np.uint8), []
    for i in range(iters + untimed):
        t0 = time.perf_counter()
        if comm.rank == 0:
            comm.send(1, x, "ping")
            comm.recv(1, "pong")
        elif comm.rank == 1:
            comm.send(0, comm.recv(0, "ping"), "pong")
        if i >= untimed:
            out.append((time.perf_counter() - t0) / 2)
    return out


def pingpong(comm, sizes=(8, 1 << 10, 1 << 16, 1 << 20, 1 << 22),
             iters=20) -> list[tuple[int, float]]:
    """Rank 0 and 1 bounce messages; returns (bytes, one-way seconds = median round trip / 2)
    per size."""
    return [(size, float(np.median(latency(comm, size, iters, untimed=2)))) for size in sizes]


def run(cluster, algorithms, sizes, dtype="float32", iters=20, warmup=5) -> tuple[dict, list[dict]]:
    """Measure α, β between ranks 0 and 1, then every (algorithm, size); rows combined over
    ranks."""
    p2p = {}
    if cluster.world_size >= 2:
        points = cluster.run(pingpong)[0]
        alpha, beta = fit_alpha_beta(*zip(*points, strict=True))
        # a thousand round trips after a hundred untimed (80 ms on shm): the first ones after the
        # large messages above still meet their segments' releases
        one_way = cluster.run(latency, 8, *((1000, 100) if cluster.links is None else (10, 5)))[0]
        p2p = {"alpha_us": points[0][1] * 1e6, "fit_alpha_us": alpha * 1e6,
               "bandwidth_gbps": points[-1][0] / points[-1][1] / 1e9,
               "fit_bandwidth_gbps": (1 / beta / 1e9) if beta else float("inf"), "points": points,
               "p50_us": float(np.percentile(one_way, 50)) * 1e6,
               "p99_us": float(np.percentile(one_way, 99)) * 1e6,
               "window_us": cluster.run(window_one_way)[0], "pipe_us": pipe_one_way_us(),
               "pinned_us": pinned_floors(), "contract_us": contract_us()}
    return p2p, combine(cluster.run(measure, algorithms, sizes, dtype, iters, warmup))


def combine(per_rank: list[list[dict]]) -> list[dict]:
    """One row per (algorithm, size) from every rank's rows: the slowest rank's time, everyone's
    #wrong."""
    rows = []
    for by_rank in zip(*per_rank, strict=True):
        row = dict(by_rank[0])
        # the collective ends when its slowest rank does (in each timed-alone iteration)
        row["time_us"] = (float(np.median(np.max([r["iter_us"] for r in by_rank], axis=0)))
                          if "iter_us" in row else max(r["time_us"] for r in by_rank))
        row.pop("iter_us", None)
        row["wrong"] = sum(r["wrong"] for r in by_rank)
        row["algbw_gbps"] = row["bytes"] / (row["time_us"] * 1e-6) / 1e9
        row["busbw_gbps"] = row["algbw_gbps"] * bus_factor(row["world_size"])
        rows.append(row)
    return rows


def peer_rows(peer: str, world_size: int, sizes, dtype="float32", iters=20, warmup=5,
              timeout=1800.0) -> list[dict]:
    """The engine's own all-reduce ("gloo": torch.distributed, "mpi": mpi4py) on `world_size`
    processes of this machine, timed by `measure` as ours are; RuntimeError when the engine is
    missing or fails."""
    if peer not in ENGINES:
        raise ValueError(f"unknown peer {peer!r}; valid: {', '.join(ENGINES)}")
    return combine(run_on_engine(measure, peer, world_size, [peer], list(sizes), dtype, iters,
                                 warmup, timeout=timeout))


def add_predictions(rows: list[dict], links, fitted=None) -> None:
    """Put the α-β model's time on emulated `links` beside each row ("model_us"; None where it
    has no model), and on the links `fitted` to them ("fit_us"), when given."""
    for r in rows:
        for key, on in (("model_us", links), ("fit_us", fitted)):
            if on is not None:
                seconds = predict_on_links(r["algorithm"], r["world_size"], r["bytes"], on)
                r[key] = None if seconds is None else seconds * 1e6


def format_p2p(p2p: dict) -> str:
    if not p2p:
        return "# point-to-point: needs 2 ranks"
    spread = (f" (p50 {p2p['p50_us']:.0f} us, p99 {p2p['p99_us']:.0f} us)"
              if "p99_us" in p2p else "")
    floor = ""
    if "pipe_us" in p2p:  # the mechanism under it, timed in the same run (bench/floor.py)
        floor = (f"\n# the floor, 8 B one way: a bare os.pipe ping-pong between two processes "
                 f"{p2p['pipe_us']:.1f} us; send/recv p50 = "
                 f"{p2p['p50_us'] / p2p['pipe_us']:.1f}x it")
        if p2p.get("window_us") is not None:
            floor += (f"; a symmetric window's put + signal {p2p['window_us']:.1f} us = "
                      f"{p2p['window_us'] / p2p['pipe_us']:.1f}x it")
        contract = p2p.get("contract_us")  # what every send/recv costs before any wire
        if contract is not None:
            floor += (f"; the contract alone (send + recv between two thread ranks, no wire) "
                      f"{contract:.1f} us = {contract / p2p['pipe_us']:.1f}x it")
        if p2p.get("pinned_us"):  # which of the two the floor above was, by where they ran
            one, two = p2p["pinned_us"]["one core"], p2p["pinned_us"]["two cores"]
            floor += (f"\n# the same pipe pinned: {one:.1f} us on one core (a hand-over), "
                      f"{two:.1f} us across two (an idle core wakes up); send/recv p50 = "
                      f"{p2p['p50_us'] / one:.1f}x and {p2p['p50_us'] / two:.1f}x them")
    return (f"# point-to-point, rank 0 <-> 1 (ping-pong): "
            f"latency alpha = {p2p['alpha_us']:.0f} us (8 B one way){spread}, "
            f"bandwidth 1/beta = {p2p['bandwidth_gbps']:.2f} GB/s "
            f"({p2p['points'][-1][0] >> 20} MiB one way){floor}")


def format_table(rows: list[dict]) -> str:
    """The rows as nccl-tests prints them (one algorithm after another)."""
    head = (f"#{'size':>11} {'count':>11} {'type':>8} {'algorithm':>19} {'time':>10} "
            f"{'algbw':>8} {'busbw':>8} {'#wrong':>7}\n"
            f"#{'(B)':>11} {'(elements)':>11} {'':>8} {'':>19} {'(us)':>10} "
            f"{'(GB/s)':>8} {'(GB/s)':>8} {'':>7}")
    # emulated links: the α-β model's time beside the measured one (and the fitted model's)
    extra = [(key, name) for key, name in (("model_us", "model"), ("fit_us", "fitted"))
             if any(key in r for r in rows)]
    for _, name in extra:
        head = "\n".join(f"{line} {unit:>10}"
                         for line, unit in zip(head.split("\n"), (name, "(us)"), strict=True))
    lines = [head]
    for r in rows:
        predicted = "".join(f" {r[key]:>10.1f}" if r.get(key) is not None else f" {'-':>10}"
                            for key, _ in extra)
        lines.append(f" {r['bytes']:>11} {r['count']:>11} {r['dtype']:>8} {r['algorithm']:>19} "
                     f"{r['time_us']:>10.1f} {r['algbw_gbps']:>8.3f} {r['busbw_gbps']:>8.3f} "
                     f"{r['wrong']:>7}{predicted}")
    return "\n".join(lines)


JSON_KEYS = ("algorithm", "world_size", "bytes", "count", "dtype", "time_us", "algbw_gbps",
             "busbw_gbps", "wrong")


def write_json(path, rows: list[dict]) -> None:
    with open(path, "w") as f:
        keys = JSON_KEYS + ("model_us", "fit_us")
        json.dump([{k: r[k] for k in keys if k in r} for r in rows], f, indent=1)

