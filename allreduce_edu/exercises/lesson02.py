"""Lesson 02 · naive all-reduce: write reduce-to-root + broadcast on real ranks; count the bytes.

`check_naive_allreduce` runs your function on real gRPC ranks with the inputs of harness.py, which
say where every number came from (element i of rank r is i·2^27 + 8^r), through a `Spy` comm that
writes down what each message carried: so it can name the first message that differs from the
picture.
"""

from __future__ import annotations

import numpy as np

from ..comm.errors import CollectiveTimeout
from ..runtime import Cluster
from .feedback import Feedback, failed, passed
from .harness import ranks_text, result_problem, run_learner
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - the notebook's
from .spec import MIB, Blank, Slip, choice, number


@exercise("02.1", kind="code", function="my_naive_allreduce",
          library=("collectives.naive:allreduce_naive",))
def check_naive_allreduce(fn, world_sizes=(3, 4), shapes=((10,), (100_003,)),
                          timeout: float = 15.0, transport: str = "grpc") -> Feedback:
    """Exercise 02.1: `fn(comm, x)` = reduce to rank 0 + broadcast from it, with send/recv, on gRPC.

    transport="local" runs the same checks on thread ranks (the tests use it for quick wrong
    answers).
    """
    for n in world_sizes:
        with Cluster(n, transport, timeout=timeout) as cluster:
            for shape in shapes:
                reports, error = run_learner(cluster, fn, shape, ("send", "recv"),
                                             _naive_explain(n))
                if error is not None:
                    return error
                problem = _naive_problem(reports, cluster.trace, n, shape)
                if problem:
                    return failed(f"{n} ranks, x of shape {shape}: {problem}")
                root_bytes = sum(e.nbytes for e in cluster.trace.events if e.dst == 0)
    s = int(np.prod(shapes[-1])) * 8
    return passed(f"your naive all-reduce matches NumPy on {' and '.join(map(str, world_sizes))} "
                  f"gRPC ranks. With {n} ranks and S = {s} bytes the root received {n - 1} "
                  f"messages, {root_bytes} bytes = (N−1)·S, and sent as many; every other rank "
                  f"sent S once.")


def _naive_explain(n: int):
    def explain(trace, error) -> str | None:
        for e in trace.events:
            if e.src != 0 and e.dst != 0:
                return (f"rank {e.src} sent a message to rank {e.dst}: in the naive all-reduce "
                        f"every rank talks only to the root, rank 0.")
        if not isinstance(error, CollectiveTimeout):
            return None
        senders = {e.src for e in trace.events if e.dst == 0}
        silent = sorted(set(range(1, n)) - senders)
        if silent:
            return (f"Rank(s) {silent} never sent their x to the root (with a tag the root "
                    f"receives).")
        if not any(e.src == 0 for e in trace.events):
            return ("The root never sent the sum back: after adding everything up, send the "
                    "total to every other rank (the broadcast half).")
        return None
    return explain


def _naive_problem(reports, trace, n: int, shape) -> str | None:
    """The first thing wrong with a naive all-reduce's traffic, results or inputs; or None."""
    for rank in range(1, n):
        for dst, *_ in reports[rank]["sends"]:
            if dst != 0:
                return (f"rank {rank} sent a message to rank {dst}: in the naive all-reduce every "
                        f"rank talks only to the root, rank 0.")
    for rank in range(1, n):
        sends = reports[rank]["sends"]
        if not sends:
            return f"rank {rank} never sent its x to the root: comm.send(0, x, tag=...)."
        if len(sends) > 1:
            return f"rank {rank} sent {len(sends)} messages to the root; it sends its x once."
        counts = sends[0][4]
        if counts != tuple(int(r == rank) for r in range(n)):
            return f"rank {rank} sent something other than its own x to the root: send x itself."
    root = reports[0]["sends"]
    if not root:
        return ("the root never sent the sum back, so the other ranks only have their own data: "
                "after adding everything up, send the total to every other rank (that is the "
                "broadcast half).")
    got = sorted(dst for dst, *_ in root)
    if got != list(range(1, n)):
        missing = sorted(set(range(1, n)) - set(got))
        if missing:
            return (f"the root sent the sum to ranks {got} but not to {missing}: send it to every "
                    f"rank 1..N-1.")
        return (f"the root sent {len(root)} messages to ranks {got}: send the sum once to each "
                f"other rank.")
    for dst, _, _, position, counts in root:
        if counts is None or position != 0:
            return (f"the root sent rank {dst} something that is not the sum of whole x's: send "
                    f"the total.")
        if counts[0] == 0:
            return (f"the root sent rank {dst} a sum without its own x: start from the root's x "
                    f"(total = x.copy()), then add what arrives.")
        if counts != (1,) * n:
            return (f"the root sent rank {dst} the data of {ranks_text(counts)}: receive from "
                    f"every other rank, and add each x exactly once, before you send.")
    into_root = sum(1 for e in trace.events if e.dst == 0)
    if into_root != n - 1:
        return f"the root received {into_root} messages; with {n} ranks it receives N−1 = {n - 1}."
    for rank in range(n):
        problem = result_problem(rank, reports[rank]["result"], n, shape)
        if problem:
            return problem
    for rank in range(n):
        if reports[rank]["modified"]:
            hint = (" `total = x` makes total another name for x, so += writes into x: start from "
                    "x.copy()." if rank == 0 else
                    " Leave x as it is: send it, and return what the root sends back.")
            return (f"rank {rank}'s input x changed during your all-reduce: the caller's data must "
                    f"stay as it was.{hint}")
    return None


number("02.2", module=__name__,
       blanks=(Blank("my_root_sent", key="(12 - 1) * (2 << 20)"),
               Blank("my_root_received", key="(12 - 1) * (2 << 20)")),
       inputs={"world_size": 12, "nbytes": 2 << 20}, unit="bytes", exact=True,
       answer=lambda d: {"root_sent": (d.world_size - 1) * d.nbytes,
                      "root_received": (d.world_size - 1) * d.nbytes},
       slips=lambda d: [
        Slip((d.world_size - 1) * d.nbytes / MIB, "looks-like-mib"),
        Slip(d.world_size - 1, "number-messages-each"),
        Slip(d.world_size * d.nbytes, "n-root-does"),
        Slip(d.nbytes, "each-other-ranks"),
        Slip(2 * (d.world_size - 1) * d.nbytes, "2-n-1"),
        Slip((d.world_size - 1) * MIB, "n-1-1", values={"mib": d.nbytes / MIB}),
    ],
       values=lambda d: {"others": d.world_size - 1, "root_bytes": (d.world_size - 1) * d.nbytes,
                         "root_mib": (d.world_size - 1) * d.nbytes / MIB, "mib": d.nbytes / MIB})


choice("02.3", module=__name__)
