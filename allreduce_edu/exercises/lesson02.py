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
from .texts import message


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
    return passed(message(__name__, "02.1", "naive-all-reduce",
                          listed=' and '.join(map(str, world_sizes)), n=n, s=s,
                          messages=n - 1, root_bytes=root_bytes))


def _naive_explain(n: int):
    def explain(trace, error) -> str | None:
        for e in trace.events:
            if e.src != 0 and e.dst != 0:
                return (message(__name__, "02.1", "rank-src-sent", src=e.src, dst=e.dst))
        if not isinstance(error, CollectiveTimeout):
            return None
        senders = {e.src for e in trace.events if e.dst == 0}
        silent = sorted(set(range(1, n)) - senders)
        if silent:
            return (message(__name__, "02.1", "rank-silent-never", silent=silent))
        if not any(e.src == 0 for e in trace.events):
            return (message(__name__, "02.1", "no-sum-back"))
        return None
    return explain


def _naive_problem(reports, trace, n: int, shape) -> str | None:
    """The first thing wrong with a naive all-reduce's traffic, results or inputs; or None."""
    for rank in range(1, n):
        for dst, *_ in reports[rank]["sends"]:
            if dst != 0:
                return (message(__name__, "02.1", "sent-to-non-root", rank=rank, dst=dst))
    for rank in range(1, n):
        sends = reports[rank]["sends"]
        if not sends:
            return message(__name__, "02.1", "never-sent", rank=rank)
        if len(sends) > 1:
            return message(__name__, "02.1", "sent-many", rank=rank, count=len(sends))
        counts = sends[0][4]
        if counts != tuple(int(r == rank) for r in range(n)):
            return message(__name__, "02.1", "sent-other", rank=rank)
    root = reports[0]["sends"]
    if not root:
        return (message(__name__, "02.1", "root-never-sent"))
    got = sorted(dst for dst, *_ in root)
    if got != list(range(1, n)):
        missing = sorted(set(range(1, n)) - set(got))
        if missing:
            return (message(__name__, "02.1", "root-sent-sum", got=got, missing=missing))
        return (message(__name__, "02.1", "root-sent-count", count=len(root), got=got))
    for dst, _, _, position, counts in root:
        if counts is None or position != 0:
            return (message(__name__, "02.1", "root-sent-rank", dst=dst))
        if counts[0] == 0:
            return (message(__name__, "02.1", "sum-without-root", dst=dst))
        if counts != (1,) * n:
            return (message(__name__, "02.1", "sum-of-some", dst=dst,
                            ranks_text=ranks_text(counts)))
    into_root = sum(1 for e in trace.events if e.dst == 0)
    if into_root != n - 1:
        return message(__name__, "02.1", "root-received-into", into_root=into_root, n=n,
                       others=n - 1)
    for rank in range(n):
        problem = result_problem(rank, reports[rank]["result"], n, shape)
        if problem:
            return problem
    for rank in range(n):
        if reports[rank]["modified"]:
            hint = (message(__name__, "02.1", "total-x-makes") if rank == 0 else
                    message(__name__, "02.1", "leave-x-as"))
            return (message(__name__, "02.1", "input-changed", rank=rank, hint=hint))
    return None


number("02.2", module=__name__,
       blanks=(Blank("my_root_sent", key="(12 - 1) * 12 * (2 << 20)"),
               Blank("my_root_received", key="(12 - 1) * (2 << 20)")),
       inputs={"world_size": 12, "nbytes": 2 << 20}, unit="bytes", exact=True,
       # a naive all-gather: every rank's S to the root, all N·S back to each of the others
       answer=lambda d: {"root_sent": (d.world_size - 1) * d.world_size * d.nbytes,
                         "root_received": (d.world_size - 1) * d.nbytes},
       slips=lambda d: [
        Slip((d.world_size - 1) * d.nbytes, "sent-one-buffer", blank="root_sent"),
        Slip(d.world_size * d.world_size * d.nbytes, "counted-itself", blank="root_sent"),
        Slip((d.world_size - 1) * d.world_size * d.nbytes, "received-everything",
             blank="root_received"),
        Slip(d.world_size * d.nbytes, "counted-itself", blank="root_received"),
        Slip((d.world_size - 1) * d.nbytes / MIB, "looks-like-mib"),
        Slip((d.world_size - 1) * d.world_size * d.nbytes / MIB, "looks-like-mib"),
        Slip(d.world_size - 1, "messages-in", blank="root_received"),
        Slip(d.world_size - 1, "messages-out", blank="root_sent"),
        Slip(d.nbytes, "each-other-ranks"),
        Slip((d.world_size - 1) * MIB, "table-s", blank="root_received"),
        Slip((d.world_size - 1) * d.world_size * MIB, "table-s", blank="root_sent"),
    ],
       values=lambda d: {"others": d.world_size - 1,
                         "received": (d.world_size - 1) * d.nbytes,
                         "sent": (d.world_size - 1) * d.world_size * d.nbytes,
                         "received_mib": (d.world_size - 1) * d.nbytes / MIB,
                         "sent_mib": (d.world_size - 1) * d.world_size * d.nbytes / MIB,
                         "mib": d.nbytes / MIB})


choice("02.3", module=__name__)
