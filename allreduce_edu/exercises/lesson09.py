"""Lesson 09 · beyond one machine: your ring on real engines, torch.distributed's names,
hierarchical and in-network.

`check_ring_on_engine` runs your ring on gloo (or MPI) processes and compares every rank's result
with the engine's own all-reduce of the same inputs (the engine is the oracle). Where the engine is
not installed it says so and runs the same checks on gRPC ranks whose sends wait for the receiver
as gloo's do (comm.ssend), against NumPy.
"""

from __future__ import annotations

import cloudpickle
import numpy as np

from ..model.costmodel import predict, predict_on_links
from ..model.links import Links
from ..runtime import Cluster, missing, ship
from ..runtime.engines import rank_input
from .engine_check import RingFailed, explain_failure, first_problem, ring_on_rank, with_prefix
from .feedback import Feedback, failed, passed
from .harness import engine_ranks, run_on_ranks
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - notebook
from .spec import Blank, Slip, choice, names, number
from .texts import message
from .torch_names import TORCH_NAMES, names_cell, torch_name

NAMES_SCAFFOLD = names_cell(lambda theirs: "?")  # what the lesson ships

SCENARIO = {"nodes": 3, "ranks_per_node": 4, "nbytes": 256 << 20,
            "intra": (5e-6, 1 / 200e9), "inter": (20e-6, 1 / 25e9)}  # NVLink-like, InfiniBand

BUILTIN = {"gloo": "torch.distributed.all_reduce", "mpi": "MPI_Allreduce"}
#: without the engine: gRPC ranks whose sends return once the receiver has the message (comm.ssend)
STAND_IN = "gRPC ranks with synchronous sends"


@exercise("09.1", kind="code", function="fixed_ring",
          library=("collectives.ring:allreduce_ring_plain", "collectives.ring:allreduce_ring",
                   "collectives.ring:reduce_scatter_ring", "collectives.ring:all_gather_ring"),
          gaps=(1, 2))
def check_ring_on_engine(fn, engine: str = "gloo", world_sizes=(3, 5), sizes=(10, 1_000_003),
                         comm_timeout: float = 10.0, timeout: float = 120.0) -> Feedback:
    """Exercise 09.1: your ring on `engine` processes, against the engine's own all-reduce.

    Without the engine it runs on gRPC ranks whose sends are synchronous (comm.ssend: a send
    returns once the receiver has taken the message, as on gloo), against NumPy's sum: the same
    faults fail the same way, and a pass counts."""
    blob, why = ship(fn, (), {}), missing(engine)
    ranks = STAND_IN if why else f"{engine} processes"
    prefix = (message(__name__, "09.1", "engine-available-here", engine=engine, why=why)
              if why else "")
    for n in world_sizes:
        if why:
            with Cluster(n, timeout=comm_timeout) as cluster:
                per_rank, failure = run_on_ranks(cluster, ring_on_rank, blob, list(sizes), True)
        else:
            per_rank, failure = run_on_ranks(engine_ranks(engine, n, timeout, comm_timeout),
                                             ring_on_rank, blob, list(sizes))
        if failure and isinstance(failure.error, RingFailed):
            return failed(with_prefix(prefix, explain_failure(failure, engine, f"{n} {ranks}")))
        if failure:  # the engine itself failed: say so, don't crash
            e = failure.error
            return failed(with_prefix(prefix, f"with {n} {ranks} the run failed: "
                                              f"{type(e).__name__}: {str(e)[:500]}"))
        oracle = engine if not why else "NumPy's sum"
        problem = first_problem(per_rank, f"{n} {ranks}", sizes, oracle)
        if problem:
            return failed(with_prefix(prefix, problem))
    counts = " and ".join(map(str, world_sizes))
    elements = " and ".join(f"{s:,}" for s in sizes)
    if why:
        return passed(message(__name__, "09.1", "ring-matches-numpy", engine=engine,
                              counts=counts, elements=elements))
    return passed(message(__name__, "09.1", "ring-gives-exactly", engine=engine,
                          BUILTIN=BUILTIN[engine], counts=counts,
                          elements=elements))


def compare_with_numpy(fn, world_size: int = 3, sizes=(10, 1_000_003),
                       dtypes=("float32", "int64")) -> list[dict]:
    """runtime.compare_with_builtin's rows where no engine is installed: `fn(comm, x)` on gRPC
    ranks against NumPy's sum of the same rank-derived x (rank 0's + rank 1's + ..., in order)."""
    blob = ship(fn, (), {})
    with Cluster(world_size) as cluster:
        per_rank = cluster.run(_ours_on_rank, blob, list(sizes), list(dtypes))
    rows = []
    for j, (dtype, size) in enumerate((d, s) for d in dtypes for s in sizes):
        oracle = np.sum([rank_input(r, size, dtype) for r in range(world_size)], axis=0,
                        dtype=dtype)
        errors = [float(np.max(np.abs(np.asarray(ours[j], np.float64) - oracle), initial=0.0))
                  if np.shape(ours[j]) == oracle.shape else float("inf") for ours in per_rank]
        ok = all(np.shape(ours[j]) == oracle.shape and (
            np.allclose(ours[j], oracle, rtol=1e-5, atol=1e-5) if dtype.startswith("float")
            else np.array_equal(ours[j], oracle)) for ours in per_rank)
        rows.append({"dtype": dtype, "size": size, "max_error": max(errors), "ok": ok,
                     "engine": "numpy", "world_size": world_size})
    return rows


def _ours_on_rank(comm, blob: bytes, sizes, dtypes) -> list:
    fn = cloudpickle.loads(blob)[0]
    return [np.asarray(fn(comm, rank_input(comm.rank, size, dtype)))
            for dtype in dtypes for size in sizes]


names("09.2", module=__name__, table=TORCH_NAMES, normalise=torch_name,
      key_value=lambda theirs: f"dist.{theirs[0]}",
      fallback=lambda ours, got: message(__name__, "09.2", "look-for-ours", ours=ours),
      success=message(__name__, "09.2", "all-count-names", count=len(TORCH_NAMES)))


def scenario_seconds(algorithm: str) -> float:
    """The α-β model's time for Exercise 09.3's cluster (3 nodes of 4 ranks, 256 MiB)."""
    s = SCENARIO
    links = Links.two_level(s["ranks_per_node"], s["intra"], s["inter"])
    return predict_on_links(algorithm, s["nodes"] * s["ranks_per_node"], s["nbytes"], links)


number("09.3", module=__name__,
       setup="S = 256 * 2**20\n"
             "a_intra, b_intra, a_inter, b_inter = 5e-6, 1 / 200e9, 20e-6, 1 / 25e9",
       blanks=(Blank("my_ring", key="2 * 11 * a_inter + 2 * 11 / 12 * S * b_inter"),
               Blank("my_hierarchical", key="(2 * 3 * a_intra + 2 * 3 / 4 * S * b_intra\n"
                     "                   + 2 * 2 * a_inter + 2 * 2 / 3 * (S / 4) * b_inter)")),
       unit="seconds",
       answer=lambda d: {"ring": scenario_seconds("ring"),
                      "hierarchical": scenario_seconds("hierarchical")},
       slips=lambda d: _hierarchical_slips(),
       otherwise=lambda d, name, got: (
        message(__name__, "09.3", "off-by", factor=got / scenario_seconds(name))),
       success=lambda d: _hierarchical_success())


def _hierarchical_slips() -> list:
    s = SCENARIO
    size, nodes, big = s["ranks_per_node"], s["nodes"], s["nbytes"]
    n = nodes * size
    (a_in, b_in), (a_out, b_out) = s["intra"], s["inter"]
    return [
        Slip(predict("ring", n, big, a_in, b_in), "ring-on-fast", "ring"),
        Slip(scenario_seconds("ring") * 1e3, "looks-like-milliseconds",
             "ring"),
        Slip(2 * (n - 1) * (a_out + big * b_out), "each-ring-step", "ring"),
        Slip(predict("ring", size, big, a_in, b_in) + predict("ring", nodes, big, a_out, b_out),
             "across-nodes-each",
             "hierarchical"),
        Slip(predict("ring", size, big, a_in, b_in) + predict("ring", n, big / size, a_out, b_out),
             "inter-node-ring", "hierarchical"),
        Slip(predict("ring", nodes, big / size, a_out, b_out), "inter-node-phase",
             "hierarchical"),
        Slip(scenario_seconds("hierarchical") * 1e3, "looks-like-milliseconds", "hierarchical"),
    ]


def _hierarchical_success() -> str:
    ring, hierarchical = scenario_seconds("ring"), scenario_seconds("hierarchical")
    return message(__name__, "09.3", "ring-and-hierarchical", ms=ring * 1e3,
                   hierarchical=hierarchical * 1e3, faster=ring / hierarchical,
                   nodes=SCENARIO['nodes'], ranks=SCENARIO['nodes'] * SCENARIO['ranks_per_node'])


choice("09.4", module=__name__)
