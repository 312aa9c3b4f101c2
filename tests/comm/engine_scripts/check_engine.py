"""Run under an engine (mpirun -n N, or allreduce-edu launch -n N for gloo): our algorithms against the engine's own.

    python check_engine.py mpi|gloo [RANKS_PER_NODE]

Every rank checks its result against the engine's built-in all-reduce of the same inputs (the oracle):
float32 to tolerance, int64 exactly. Prints one line per failure and "ENGINE OK <n> checks" at the end.
"""

import sys

import numpy as np

import allreduce_edu as ae

ALGORITHMS = ["ring", "tree", "recursive_doubling", "rabenseifner", "hierarchical", "naive"]


def inputs(rank: int, count: int, dtype: str) -> np.ndarray:
    """Rank-derived data: random floats (so sums round differently by order) or integers with big values."""
    rng = np.random.default_rng(1000 + rank)
    if dtype == "float32":
        return rng.standard_normal(count).astype(np.float32)
    return rng.integers(-(1 << 40), 1 << 40, count) + rank


def main(engine: str, ranks_per_node: int | None) -> int:
    if engine == "mpi":
        from allreduce_edu.comm.transports.engine.mpi import MPICommunicator
        comm = MPICommunicator(timeout=60)
    else:
        from allreduce_edu.comm.transports.engine.torch_dist import TorchCommunicator
        comm = TorchCommunicator(timeout=60)
    if ranks_per_node:
        comm.ranks_per_node = ranks_per_node
    failures, checks = [], 0
    for algorithm in ALGORITHMS:
        for dtype in ("float32", "int64"):
            for op in ("sum", "max"):
                for count in (1, 2, 7, 1001):
                    x = inputs(comm.rank, count, dtype)
                    ours, oracle = ae.allreduce(comm, x, op, algorithm), comm.builtin_allreduce(x, op)
                    same = (np.allclose(ours, oracle, rtol=1e-5, atol=1e-5) if dtype == "float32"
                            else np.array_equal(ours, oracle))
                    checks += 1
                    if not same or ours.dtype != x.dtype or ours.shape != x.shape:
                        failures.append(f"rank {comm.rank}: {algorithm} {op} {dtype} count={count}: ours {ours[:4]} "
                                        f"vs {engine} {oracle[:4]}")
    comm.barrier()
    assert comm.trace.events and comm.trace.receives, "the engine transport recorded no trace events"
    for line in failures:
        print("MISMATCH", line, flush=True)
    if comm.rank == 0 and not failures:
        print(f"ENGINE OK {checks} checks on {comm.world_size} ranks over {engine}", flush=True)
    comm.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else None))
