"""Lesson 16 · NCCL's algorithms: the double binary tree, Bruck's all-gather, the tuner.

`check_tree2` takes your tree 2 (`my_tree2(world_size, rank) -> (parent, children)`) for N = 1..9
and names the first rank that is interior in both trees, or that would send more than the double
binary tree's 2·S; `check_tuner_choice` takes a letter. The rest are the lesson's small tools:
bytes per port from a trace, a tree drawn by depth, the pipelined model for any K, NCCL's log lines.
"""

from __future__ import annotations

import time

import numpy as np

from ..collectives import all_gather, allreduce
from ..collectives.double_binary_tree import (
    Tree,
    btree,
    double_binary_tree,
    link_between_nodes,
    model,
    programs,
    trees,
)
from ..model.links import Links
from ..model.tuner import tune
from ..runtime import TESTBED, Cluster
from .feedback import Feedback, failed, passed
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - notebook
from .spec import choice
from .texts import message


# --- the lesson's tools ------------------------------------------------------------------------
def trace_of(algorithm: str, world_size: int, count: int = 1024):
    """The trace of one all-reduce of `count` float32 per rank on thread ranks: instant."""
    with Cluster(world_size, transport="local") as cluster:
        cluster.run(lambda comm: allreduce(comm, np.ones(count, np.float32), algorithm=algorithm))
        return cluster.trace


def port_use(trace, world_size: int) -> dict[str, list[tuple[int, int]]]:
    """{phase: [(bytes sent, bytes received) of rank r, ...]}: what each port carried."""
    use: dict[str, list[list[int]]] = {}
    for e in trace.events:
        ranks = use.setdefault(e.tag, [[0, 0] for _ in range(world_size)])
        ranks[e.src][0] += e.nbytes
        ranks[e.dst][1] += e.nbytes
    return {tag: [tuple(r) for r in ranks] for tag, ranks in use.items()}


def draw(tree: Tree) -> str:
    """A tree as rows by depth, each rank with its parent: `depth 2: 2(↑4) 6(↑4)`."""
    rows: dict[int, list[str]] = {}
    for r in range(len(tree.parent)):
        up = "" if tree.parent[r] < 0 else f"(↑{tree.parent[r]})"
        rows.setdefault(tree.depth[r], []).append(f"{r}{up}")
    return "\n".join(f"  depth {d}: {' '.join(ranks)}" for d, ranks in sorted(rows.items()))


def interior(tree: Tree) -> list[int]:
    """The ranks with children."""
    return [r for r, children in enumerate(tree.children) if children]


def pipelined_model(world_size: int, nbytes: float, chunks: int, links: Links = TESTBED) -> float:
    """Seconds the double binary tree takes on `links` with `chunks` per tree: every rank's
    messages in its program's order, on one port per rank (portsim)."""
    return model(world_size, nbytes, links.inter, links.link, chunks=chunks)


def time_chunks(comm, nbytes: int, chunk_counts, reps: int = 1) -> dict[int, float]:
    """Run on every rank: the best of `reps` times of one double binary tree per K, after a
    barrier."""
    x, out = np.ones(nbytes // 4, np.float32), {}
    for k in chunk_counts:
        programs(comm.world_size, k, float(x.nbytes), link_between_nodes(comm))  # planned, untimed
        times = []
        for _ in range(reps):
            comm.barrier()
            t0 = time.perf_counter()
            double_binary_tree(comm, x, chunks=k)
            times.append(time.perf_counter() - t0)
        out[k] = min(times)
    return out


def gather_counts(algorithm: str, world_size: int, count: int = 1000) -> tuple[int, int]:
    """(steps, most bytes a rank sent) of one all-gather of `count` float32 per rank, from the
    trace of its "all_gather" phase (Bruck's also swaps the 8-byte lengths first: tag "sizes")."""
    with Cluster(world_size, transport="local") as cluster:
        cluster.run(lambda comm: all_gather(comm, np.ones(count, np.float32), algorithm=algorithm))
        events = [e for e in cluster.trace.events if e.tag == "all_gather"]
    sent = [sum(e.nbytes for e in events if e.src == r) for r in range(world_size)]
    return max((e.step + 1 for e in events), default=0), max(sent)


def tuner_agreement(rows, links: Links = TESTBED) -> list[tuple[int, str, str]]:
    """(size, the tuner's algorithm, the measured fastest) for each size of `rows`
    (bench.compare's), the tuner choosing among the algorithms measured."""
    sizes = sorted({r["bytes"] for r in rows})
    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
    world_size = rows[0]["world_size"]
    tuned = {t["size"]: t["algorithm"] for t in tune(world_size, sizes, links, algorithms)}
    fastest = {s: min((r for r in rows if r["bytes"] == s), key=lambda r: r["time_us"])
               for s in sizes}
    return [(s, tuned[s], fastest[s]["algorithm"]) for s in sizes]


# NCCL's names and numbers (src/include/plugin/nccl_tuner.h) for the algorithms NCCL also runs
NCCL_ALGORITHMS = {"double_binary_tree": ("Tree", 0), "ring": ("Ring", 1)}
NCCL_PROTOCOLS = {"LL": 0, "LL128": 1, "Simple": 2}


def nccl_trees_line(world_size: int, rank: int, pair=None) -> str:
    """What NCCL_DEBUG=INFO prints at init for `rank` (src/init.cc: "Trees" then, per channel,
    " [%d] %d/%d/%d->%d->%d": children down[0..2], the rank, its parent; -1: none). NCCL runs
    tree 1 on even channels and tree 2 on odd ones."""
    parts = []
    for channel, tree in enumerate(pair or trees(world_size)):
        down = (list(tree.children[rank]) + [-1, -1, -1])[:3]
        parts.append(f" [{channel}] {down[0]}/{down[1]}/{down[2]}->{rank}->{tree.parent[rank]}")
    return "NCCL INFO Trees" + "".join(parts)


def nccl_tuning_lines(row) -> list[str]:
    """A tune() row as NCCL prints its choice: the INFO line (NCCL_DEBUG_SUBSYS=TUNING) and the
    TRACE line of src/enqueue.cc ("%ld Bytes -> Algo %d proto %d time %f", time in µs)."""
    name, number = NCCL_ALGORITHMS[row["algorithm"]]
    return [message(__name__, "16.1", "nccl-info-best", name=name, row=row['protocol']),
            f"NCCL TRACE {row['size']} Bytes -> Algo {number} proto "
            f"{NCCL_PROTOCOLS[row['protocol']]} time {row['time'] * 1e6:f}"]


# --- exercise 16.1: tree 2 from tree 1 ---------------------------------------------------------


def _shape(got) -> tuple[int, tuple[int, ...]] | None:
    """(parent, children) from what the learner returned, or None when it is not that shape."""
    try:
        parent, children = got
        parent, children = int(parent), tuple(int(c) for c in children)
    except (TypeError, ValueError):
        return None
    return parent, children


def _tree2(fn, n: int) -> tuple[Tree | None, str]:
    """Your tree 2 on n ranks, or None and what is wrong with it."""
    shapes = []
    for r in range(n):
        try:
            got = fn(n, r)
        except Exception as e:  # noqa: BLE001 - the learner's code: report, don't crash
            return None, f"my_tree2({n}, {r}) raised {type(e).__name__}: {e}."
        shape = _shape(got)
        if shape is None:
            return None, (message(__name__, "16.1", "my-tree2-n", n=n, r=r, got=got))
        shapes.append(shape)
    try:
        return Tree.of(n, lambda _, r: shapes[r]), ""
    except ValueError as e:
        return None, (message(__name__, "16.1", "on-n-ranks", n=n, e=e))


def port_bytes(first: Tree, second: Tree, nbytes: int) -> list[int]:
    """Bytes each rank sends in an all-reduce of `nbytes` on the two trees, half the buffer each:
    its half up to its parent (reduce) and down to each child (broadcast), in both trees."""
    return [sum((tree.parent[r] >= 0) + len(tree.children[r]) for tree in (first, second))
            * nbytes // 2 for r in range(len(first.parent))]


@exercise("16.1", kind="code", function="my_tree2",
          library=("collectives.double_binary_tree:mirror_tree",), needs={"btree": btree},
          after=('from allreduce_edu.collectives.double_binary_tree import btree   # tree 1',))
def check_tree2(fn, worlds=tuple(range(1, 10)), nbytes: int = 1 << 20) -> Feedback:
    """Exercise 16.1: with tree 1 (btree) and your tree 2, every rank is interior in at most one
    tree (at most two children in both together) and sends and receives at most 2·S."""
    for n in worlds:
        second, problem = _tree2(fn, n)
        if second is None:
            return failed(problem)
        first = Tree.of(n, btree)
        for r in range(n):
            ones, twos = len(first.children[r]), len(second.children[r])
            if ones + twos > 2:
                odd = (message(__name__, "16.1", "for-odd-n") if n % 2 and ones and twos else "")
                return failed(message(__name__, "16.1", "interior-in-both", n=n, r=r, ones=ones,
                                      twos=twos, halves=ones + twos,
                                      odd=odd))
        sent, ring = port_bytes(first, second, nbytes), 2 * (n - 1) * nbytes / n
        worst = max(range(n), key=sent.__getitem__)
        if sent[worst] > 2 * nbytes:
            return failed(message(__name__, "16.1", "sends-too-much", n=n, worst=worst,
                                  sends=sent[worst] / nbytes,
                                  ring=ring / nbytes))
        if second.height[second.root] > first.height[first.root] + 1:
            return failed(message(__name__, "16.1", "too-deep", n=n,
                                  levels=second.height[second.root],
                                  every=first.height[first.root]))
    return passed(message(__name__, "16.1", "interior-in-one"))


# --- exercise 16.2: the tuner's choice on 64 ranks --------------------------------------------
CHOICES = {"a": ("ring", "Simple"), "b": ("double_binary_tree", "Simple"),
           "c": ("tree", "LL"), "d": ("double_binary_tree", "LL")}


def tuned_choice(world_size: int = 64, nbytes: int = 16 << 20, links: Links = TESTBED):
    """(algorithm, protocol) tune() picks among ring, tree and double_binary_tree."""
    [row] = tune(world_size, [nbytes], links, ["ring", "tree", "double_binary_tree"])
    return row["algorithm"], row["protocol"]


choice("16.2", module=__name__, imports="",
       right=next(k for k, v in CHOICES.items() if v == tuned_choice()))
