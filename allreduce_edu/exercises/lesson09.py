"""Lesson 09 · beyond one machine: your ring on real engines, torch.distributed's names,
hierarchical and in-network.

`check_ring_on_engine` runs your ring on gloo (or MPI) processes and compares every rank's result
with the engine's own all-reduce of the same inputs (the engine is the oracle). Where the engine is
not installed it says so and runs the same checks on gRPC ranks against NumPy.
"""

from __future__ import annotations

from ..model.costmodel import predict, predict_on_links
from ..model.links import Links
from ..runtime import Cluster, missing, ship
from .engine_check import RingFailed, explain_failure, first_problem, ring_on_rank, with_prefix
from .feedback import Feedback, failed, passed
from .harness import engine_ranks, run_on_ranks
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - notebook
from .spec import Blank, Slip, choice, names, number
from .torch_names import TORCH_NAMES, names_cell, torch_name

NAMES_SCAFFOLD = names_cell(lambda theirs: "?")  # what the lesson ships

SCENARIO = {"nodes": 3, "ranks_per_node": 4, "nbytes": 256 << 20,
            "intra": (5e-6, 1 / 200e9), "inter": (20e-6, 1 / 25e9)}  # NVLink-like, InfiniBand

BUILTIN = {"gloo": "torch.distributed.all_reduce", "mpi": "MPI_Allreduce"}
NEEDS = {"gloo": "needs torch: pip install -e '.[torch]'",
         "mpi": "needs mpi4py and mpirun: pip install -e '.[mpi]'"}


@exercise("09.1", kind="code", function="fixed_ring",
          library=("collectives.ring:allreduce_ring", "collectives.ring:reduce_scatter_ring",
             "collectives.ring:all_gather_ring"),
          gaps=(1, 2))
def check_ring_on_engine(fn, engine: str = "gloo", world_sizes=(3, 5), sizes=(10, 1_000_003),
                         comm_timeout: float = 10.0, timeout: float = 120.0) -> Feedback:
    """Exercise 09.1: your ring on `engine` processes, against the engine's own all-reduce (gRPC if
    absent)."""
    blob, why = ship(fn, (), {}), missing(engine)
    ranks = "gRPC ranks" if why else f"{engine} processes"
    prefix = (f"{engine} is not available here — {why} — so this ran on gRPC ranks with NumPy's "
              f"sum as the oracle. " if why else "")
    used: set[str] = set()
    for n in world_sizes:
        if why:
            with Cluster(n, timeout=comm_timeout) as cluster:
                per_rank, failure = run_on_ranks(cluster, ring_on_rank, blob, list(sizes))
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
        used |= {m for rows in per_rank for row in rows for m in row["used"]}
    counts = " and ".join(map(str, world_sizes))
    elements = " and ".join(f"{s:,}" for s in sizes)
    if why:  # not a verdict on gloo: ⚠, and not counted as a try
        caution = (" You use comm.send: if every rank sends before it receives, this deadlocks on "
                   "gloo (and on MPI above its eager limit); comm.sendrecv cannot."
                   if "send" in used else "")
        return Feedback(False, f"{NEEDS[engine]} ({why}), then restart the kernel and run this "
                               f"cell again. Meanwhile your ring matches NumPy on {counts} gRPC "
                               f"ranks for {elements} elements and leaves x unchanged.{caution}",
                        "check failed")
    return passed(f"your ring gives exactly what {engine}'s own all-reduce ({BUILTIN[engine]}) "
                  f"gives on {counts} {engine} processes, for {elements} elements, and leaves x "
                  f"unchanged: one function, any engine.")


names("09.2", module=__name__, table=TORCH_NAMES, normalise=torch_name,
      key_value=lambda theirs: f"dist.{theirs[0]}",
      fallback=lambda ours, got: f"Look for {ours!r} in the table above (torch.distributed "
                               f"column).",
      success=f"all {len(TORCH_NAMES)} names right. A script written against comm.sendrecv, "
            f"allreduce and friends reads like one written against torch.distributed, and vice "
            f"versa.")


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
        f"off by a factor {got / scenario_seconds(name):.2f}; see the formulas in "
        f"allreduce_edu/model/costmodel.py: ring_on_links and hierarchical_on_links."),
       success=lambda d: _hierarchical_success())


def _hierarchical_slips() -> list:
    s = SCENARIO
    size, nodes, big = s["ranks_per_node"], s["nodes"], s["nbytes"]
    n = nodes * size
    (a_in, b_in), (a_out, b_out) = s["intra"], s["inter"]
    return [
        Slip(predict("ring", n, big, a_in, b_in), "that is a ring on the fast intra-node links "
             "only; a ring over two nodes has two hops between nodes, and every step waits for "
             "its slowest hop: use the inter-node α and β.", "ring"),
        Slip(scenario_seconds("ring") * 1e3, "that looks like milliseconds: answer in seconds.",
             "ring"),
        Slip(2 * (n - 1) * (a_out + big * b_out), "each ring step sends one chunk, S/N bytes, not "
             "the whole S.", "ring"),
        Slip(predict("ring", size, big, a_in, b_in) + predict("ring", nodes, big, a_out, b_out),
             "across the nodes each rank all-reduces only its piece, S/L bytes, not the whole S.",
             "hierarchical"),
        Slip(predict("ring", size, big, a_in, b_in) + predict("ring", n, big / size, a_out, b_out),
             "the inter-node ring has one rank per node: M = N/L ranks, not N.", "hierarchical"),
        Slip(predict("ring", nodes, big / size, a_out, b_out), "that is the inter-node phase "
             "alone: add the intra-node reduce-scatter and all-gather, a ring of L ranks on S.",
             "hierarchical"),
        Slip(scenario_seconds("hierarchical") * 1e3, "that looks like milliseconds: answer in "
             "seconds.", "hierarchical"),
    ]


def _hierarchical_success() -> str:
    ring, hierarchical = scenario_seconds("ring"), scenario_seconds("hierarchical")
    return (f"ring {ring * 1e3:.1f} ms, hierarchical {hierarchical * 1e3:.1f} ms: "
            f"{ring / hierarchical:.1f}× faster. Only S/L per rank crosses the slow link, in a "
            f"ring of M = {SCENARIO['nodes']} instead of N = "
            f"{SCENARIO['nodes'] * SCENARIO['ranks_per_node']}.")


choice("09.4", module=__name__)
