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

FIXED_SOLUTION = """def fixed_ring(comm, x):
    n, rank = comm.world_size, comm.rank
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = np.array_split(x.reshape(-1).copy(), n)   # fixes 1 and 2: any size, and a copy of x
    for s in range(n - 1):                              # reduce-scatter
        out, into = (rank - s - 1) % n, (rank - s - 2) % n
        chunks[into] += comm.sendrecv(right, chunks[out], left, tag="rs")   # fix 3: both at once
    for s in range(n - 1):                              # all-gather
        out, into = (rank - s) % n, (rank - s - 1) % n
        chunks[into] = comm.sendrecv(right, chunks[out], left, tag="ag")
    return np.concatenate(chunks).reshape(x.shape)"""

NAMES_SCAFFOLD = names_cell(lambda theirs: "?")  # what the lesson ships

SCENARIO = {"nodes": 3, "ranks_per_node": 4, "nbytes": 256 << 20,
            "intra": (5e-6, 1 / 200e9), "inter": (20e-6, 1 / 25e9)}  # NVLink-like, InfiniBand

BUILTIN = {"gloo": "torch.distributed.all_reduce", "mpi": "MPI_Allreduce"}
NEEDS = {"gloo": "needs torch: pip install -e '.[torch]'",
         "mpi": "needs mpi4py and mpirun: pip install -e '.[mpi]'"}


@exercise(
    "09.1", "make the blog's ring run everywhere", kind="code", function="fixed_ring",
    library=("collectives.ring:allreduce_ring", "collectives.ring:reduce_scatter_ring",
             "collectives.ring:all_gather_ring"),
    solution=FIXED_SOLUTION,
    explanation="""Three fixes: np.array_split instead of reshape(n, -1) (10 elements do not divide
by 3); a copy, since reshape and array_split return views and += would write into x; sendrecv
instead of send then recv, since a send on gloo (and on MPI above its eager limit) returns only
once the receiver has taken the message.""",
    hints=('There are three things to fix: the chunks (every size must work), the input (x must '
           'stay as it was) and the messages (no send may wait forever). The checker names them '
           'one at a time; fix the one it names.',
           'x.reshape(n, -1) needs the size to divide by N, and it is a view of x, so += on a '
           "chunk writes into the caller's x. Cut a copy with np.array_split instead, and join the"
           ' chunks at the end.',
           'The key idea for the last fix: on gloo and MPI a send may wait until the receiver '
           'takes it, and in a ring every rank sends first, so all wait. Send and receive in one '
           'call, which never deadlocks, in both phases.'),
    key="""from allreduce_edu.exercises.lesson09 import check_ring_on_engine, hint, solution

""" + FIXED_SOLUTION + """


check_ring_on_engine(fixed_ring)""")
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


check_torch_names = names(
    "09.2", "our names in torch.distributed", module=__name__, checker="check_torch_names",
    question="Fill in torch.distributed's name for each of ours (use the table above; `dist.` "
             "prefixes and `()` are fine).",
    table=TORCH_NAMES, normalise=torch_name, key_value=lambda theirs: f"dist.{theirs[0]}",
    slips={
        ("rank", "rank"): "in torch.distributed the rank is a function of the process group: "
                          "get_rank().",
        ("world_size", "world_size"): "in torch.distributed it is a function: get_world_size().",
        ("allreduce", "allreduce"): "torch.distributed spells it with an underscore: all_reduce "
                                    "(NCCL: ncclAllReduce, MPI: MPI_Allreduce).",
        ("all_gather", "allgather"): "torch.distributed puts an underscore in it: all_gather.",
        ("sendrecv", "sendrecv"): "torch.distributed has no sendrecv; it posts an isend and an "
                                  "irecv together with batch_isend_irecv([P2POp(isend, ...), "
                                  "P2POp(irecv, ...)]).",
        ("init", "init"): "torch.distributed starts its process group with init_process_group "
                          "(torchrun sets the RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT it "
                          "reads).",
        ('op="sum"', "sum"): "ops are members of an enum there: ReduceOp.SUM.",
        ('op="sum"', "SUM"): "SUM lives in an enum: ReduceOp.SUM.",
    },
    fallback=lambda ours, got: f"Look for {ours!r} in the table above (torch.distributed "
                               f"column).",
    success=f"all {len(TORCH_NAMES)} names right. A script written against comm.sendrecv, "
            f"allreduce and friends reads like one written against torch.distributed, and vice "
            f"versa.",
    hints=("Every answer is in the torch.distributed column of the table above; a \"dist.\" "
           "prefix and \"()\" are fine.",
           "Two catch most people out: the rank and the world size are functions there (get_rank, "
           "get_world_size), and there is no single sendrecv call: batch_isend_irecv posts an "
           "isend and an irecv together."))


def scenario_seconds(algorithm: str) -> float:
    """The α-β model's time for Exercise 09.3's cluster (3 nodes of 4 ranks, 256 MiB)."""
    s = SCENARIO
    links = Links.two_level(s["ranks_per_node"], s["intra"], s["inter"])
    return predict_on_links(algorithm, s["nodes"] * s["ranks_per_node"], s["nbytes"], links)


check_hierarchical_prediction = number(
    "09.3", "predict ring and hierarchical across nodes", module=__name__,
    checker="check_hierarchical_prediction",
    question="A cluster of 3 nodes with 4 GPUs each (N = 12, L = 4, M = 3): inside a node α = "
             "5 µs and 1/β = 200 GB/s; between nodes α = 20 µs and 1/β = 25 GB/s. How many "
             "**seconds** does the α-β model give for a flat ring and for the hierarchical "
             "all-reduce of S = 256 MiB? Work it out from the formulas (the ring waits for its "
             "slowest hop in every step); no `predict_on_links` call.",
    setup="S = 256 * 2**20\na_intra, b_intra, a_inter, b_inter = 5e-6, 1 / 200e9, 20e-6, 1 / 25e9",
    blanks=(Blank("my_ring", "seconds: a flat ring over both nodes, from the formula",
                  "2 * 11 * a_inter + 2 * 11 / 12 * S * b_inter"),
            Blank("my_hierarchical", "seconds: the hierarchical all-reduce, from the formulas",
                  "(2 * 3 * a_intra + 2 * 3 / 4 * S * b_intra\n"
                  "                   + 2 * 2 * a_inter + 2 * 2 / 3 * (S / 4) * b_inter)")),
    unit="seconds",
    answer=lambda d: {"ring": scenario_seconds("ring"),
                      "hierarchical": scenario_seconds("hierarchical")},
    slips=lambda d: _hierarchical_slips(),
    otherwise=lambda d, name, got: (
        f"off by a factor {got / scenario_seconds(name):.2f}; see the formulas in "
        f"allreduce_edu/model/costmodel.py: ring_on_links and hierarchical_on_links."),
    success=lambda d: _hierarchical_success(),
    hints=("The flat ring crosses between the nodes in every step, and a step waits for its "
           "slowest hop: price all 2(N − 1) steps, each of S/N bytes, with the inter-node α and "
           "β.",
           "The hierarchical all-reduce is a ring of L = 4 inside each node on all S bytes (intra "
           "α and β), plus a ring of M = 3 across the nodes on S/L bytes (inter α and β): "
           "2(L−1)·α_intra + 2(L−1)/L·S·β_intra + 2(M−1)·α_inter + 2(M−1)/M·(S/L)·β_inter."),
    solution="""N = 12 ranks, L = 4 per node, M = 3 nodes, S = 256 MiB.
ring: every step has a hop between nodes, so every step waits for the inter-node link:
    2(N-1)·α_inter + 2(N-1)/N·S·β_inter = 22·20 µs + 1.83·S/25 GB/s ≈ 0.44 ms + 19.7 ms ≈ 20.1 ms
hierarchical: a ring of L in the node on S, then a ring of M across nodes on S/L:
    2(L-1)·α_intra + 2(L-1)/L·S·β_intra + 2(M-1)·α_inter + 2(M-1)/M·(S/L)·β_inter
    = 6·5 µs + 1.5·S/200 GB/s + 4·20 µs + 1.33·(S/4)/25 GB/s ≈ 2.0 ms + 3.7 ms ≈ 5.7 ms
    (3.5× faster)
    predict_on_links("ring" / "hierarchical", 12, S, Links.two_level(4, intra, inter))
    computes both.""")


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


check_in_network_answer = choice(
    "09.4", "in-network reduction on 2 ranks", module=__name__,
    checker="check_in_network_answer",
    question="In-network reduction (SHARP) lets the switch add: each rank sends S once and "
             "receives S once. On N = 2 ranks, compared with a ring, each rank sends",
    options={
        "a": "half the bytes: the switch adds both buffers, so a rank sends S/2.",
        "b": "about half: a ring rank sends about 2·S at any N, SHARP sends S.",
        "c": "no bytes at all: the switch reads the ranks' memory by itself.",
        "d": "the same bytes: at N = 2 a ring rank sends 2(N − 1)/N·S = S too.",
    },
    right="d",
    slips={
        "a": "each rank's S bytes must reach the switch before it can add them: a rank sends all "
             "of S, once.",
        "b": "2·S is the ring's limit for large N; the exact count is 2(N − 1)/N·S. Work it out "
             "at N = 2.",
        "c": "the bytes still leave each rank over its link (RDMA makes the copy cheap, not "
             "free); SHARP sends them once, S per rank.",
    },
    why="a ring rank sends 2(N − 1)/N·S, which is S at N = 2 and grows toward 2·S: in-network "
        "reduction halves the bytes only for large N. At N = 2 it still saves latency (one trip "
        "through the switch instead of 2(N − 1) = 2 steps), and rounding order becomes the "
        "switch's.",
    hints=("Work out the ring's bytes per rank, 2(N − 1)/N·S, at N = 2.",
           "With SHARP each rank sends its S bytes to the switch once. Compare the two numbers."))
