"""`allreduce-edu demo`: every algorithm once on real ranks, each checked against NumPy, with
what it did (steps, messages, bytes, time). The README's first command after installing."""

from __future__ import annotations

import time

import numpy as np

from ..collectives import allreduce, available
from ..runtime import Cluster
from ..trace import format_bytes


def _demo_rank(comm, algorithm: str, count: int, seed: int):
    x = np.random.default_rng(seed + comm.rank).standard_normal(count).astype(np.float32)
    t0 = time.perf_counter()
    y = allreduce(comm, x, "sum", algorithm)
    return y, time.perf_counter() - t0


def demo(world_size: int = 4, count: int = 1 << 18, seed: int = 0, transport: str = "grpc") -> bool:
    """Run every algorithm once on real ranks, check each against NumPy, print what each one did."""
    inputs = [np.random.default_rng(seed + r).standard_normal(count).astype(np.float32)
              for r in range(world_size)]
    reference = np.sum(np.stack(inputs).astype(np.float64), axis=0)
    print(f"{world_size} ranks over {transport}, {count} float32 per rank "
          f"({format_bytes(count * 4)})")
    print(f"{'algorithm':<20}{'steps':>6}{'messages':>10}{'max sent/rank':>15}"
          f"{'time (ms)':>11}  correct")
    all_ok = True
    with Cluster(world_size, transport=transport) as cluster:
        for algorithm in cluster.run(available)[0]:  # one_shot, two_shot: on shm and threads
            results = cluster.run(_demo_rank, algorithm, count, seed)
            outputs, seconds = zip(*results, strict=True)
            ok = (all(np.array_equal(o, outputs[0]) for o in outputs)
                  and np.allclose(outputs[0], reference, rtol=1e-4, atol=1e-4))
            all_ok &= ok
            steps = sum(cluster.trace.steps().values())
            sent = max(cluster.trace.bytes_sent().values(), default=0)
            print(f"{algorithm:<20}{steps:>6}{len(cluster.trace):>10}{format_bytes(sent):>15}"
                  f"{max(seconds) * 1e3:>11.2f}  {'yes' if ok else 'NO'}", flush=True)
    return all_ok
