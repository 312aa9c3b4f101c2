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

NAIVE_SOLUTION = """def my_naive_allreduce(comm, x):
    if comm.rank != 0:
        comm.send(0, x, tag="reduce")              # 1. everyone sends x to the root ...
        return comm.recv(0, tag="broadcast")       # 4. ... and gets the sum back
    total = x.copy()                               # 2. the root starts from its own x (a copy)
    for src in range(1, comm.world_size):
        total += comm.recv(src, tag="reduce")      #    and adds the others' in rank order
    for dst in range(1, comm.world_size):
        comm.send(dst, total, tag="broadcast")     # 3. then sends the sum to every other rank
    return total"""


@exercise(
    "02.1", "write reduce-to-root + broadcast", kind="code", function="my_naive_allreduce",
    library=("collectives.naive:allreduce_naive",),
    solution=NAIVE_SOLUTION,
    explanation="""x.copy() matters: `total = x` would make total another name for the root's x, and
+= would write the others' data into the caller's array.""",
    hints=("Look at the picture: every buffer flows into one rank, the root (rank 0), and the "
           "sum flows back out from it. Your rank tells you which of the two roles you play.",
           "Two halves. Reduce: each other rank sends its x to the root once, and the root "
           "receives from ranks 1 to N − 1 in turn and adds. Broadcast: the root sends the sum "
           "to each of them. One tag per half keeps the two kinds of message apart.",
           "The root adds into a copy of its own x, never into x itself: the caller's array must "
           "stay as it was. The other ranks return the sum they receive, not their own x.",
           'The key idea: all the data meets in one place. The root adds the N − 1 other buffers '
           'into its copy, then sends that one sum to each of the N − 1 others, who return what '
           "they receive; every message is a whole buffer, through the root's one link."),
    key="""from allreduce_edu.exercises.lesson02 import check_naive_allreduce, hint, solution

""" + NAIVE_SOLUTION + """

check_naive_allreduce(my_naive_allreduce)""")
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


check_root_bytes = number(
    "02.2", "count the root's bytes", module=__name__, checker="check_root_bytes",
    question="With N = 12 ranks and S = 2 MiB per rank, how many bytes does the root send, and "
             "how many does it receive, in one naive all-reduce?",
    blanks=(Blank("my_root_sent", "bytes the root sends: a number, or an expression",
                  "(12 - 1) * (2 << 20)"),
            Blank("my_root_received", "bytes the root receives", "(12 - 1) * (2 << 20)")),
    inputs={"world_size": 12, "nbytes": 2 << 20}, unit="bytes", exact=True,
    answer=lambda d: {"root_sent": (d.world_size - 1) * d.nbytes,
                      "root_received": (d.world_size - 1) * d.nbytes},
    slips=lambda d: [
        Slip((d.world_size - 1) * d.nbytes / MIB, "that looks like MiB: answer in bytes, e.g. "
             "3 * 1048576."),
        Slip(d.world_size - 1, "that is the number of messages: each carries a whole buffer, "
             f"S = {d.nbytes} bytes. Answer in bytes."),
        Slip(d.world_size * d.nbytes, "that is N·S: the root does not send to or receive from "
             "itself — count N − 1 peers."),
        Slip(d.nbytes, "that is S, what each of the other ranks moves. The root talks to all "
             "N − 1 of them."),
        Slip(2 * (d.world_size - 1) * d.nbytes, "that is 2(N − 1)·S, the root's traffic in both "
             "directions together; give each direction on its own."),
        Slip((d.world_size - 1) * MIB, "that is (N − 1) × 1 MiB, the S of the table above; here "
             f"each buffer is S = {d.nbytes / MIB:g} MiB = {d.nbytes} bytes."),
    ],
    otherwise="how many other ranks does the root hear from (and answer), and how many bytes is "
              "each message?",
    success=lambda d: f"the root receives and sends (N−1)·S = {d.world_size - 1} × {d.nbytes} = "
                      f"{(d.world_size - 1) * d.nbytes} bytes each way "
                      f"({(d.world_size - 1) * d.nbytes / MIB:g} MiB); every other rank moves "
                      f"S = {d.nbytes / MIB:g} MiB each way.",
    hints=("Count the root's messages first: in the reduce half it hears from every other rank, in "
           "the broadcast half it answers each of them. How many other ranks are there with "
           "N = 12?",
           "Every message carries one whole buffer of S = 2 MiB = 2 << 20 bytes, and the root "
           "never sends to itself. Answer in bytes, each direction on its own."),
    solution="""The root receives one buffer of S bytes from each of the N - 1 other ranks,
and sends the sum back to each of them:
    sent = received = (N - 1) * S = 11 * 2097152 = 23068672 bytes   (22 MiB each way)
Every other rank sends S = 2 MiB and receives S.""")


check_bottleneck_answer = choice(
    "02.3", "two roots instead of one", module=__name__, checker="check_bottleneck_answer",
    question="A variant of the naive all-reduce on 8 ranks uses two roots: every rank sends the "
             "first half of its buffer to rank 0 and the second half to rank 1, and each root "
             "reduces and broadcasts its half. For large S, compared with one root it takes",
    options={
        "a": "about the same time: the 8 ranks still send 8·S bytes in all, as before.",
        "b": "about twice as long: the two roots must also swap halves, 7 more sends.",
        "c": "about half the time: a root's link carries 3.5·S each way, not 7·S.",
        "d": "about as long as the ring: no link carries more than 1.75·S each way.",
    },
    right="c",
    slips={
        "a": "the total bytes do not set the time; the busiest link does. How many bytes cross "
             "rank 0's link now, compared with one root?",
        "b": "a root sends its other half to the other root like any rank does, S/2 bytes; that "
             "adds one message, not a second round. Count the bytes on rank 0's link.",
        "d": "1.75·S, 2(N − 1)/N·S at N = 8, is the ring's busiest link; a root still hears "
             "from all 7 others, (N − 1)·S/2 = 3.5·S each way. Better, not gone.",
    },
    why="the time is set by the busiest link, and each root now receives and sends (N − 1) "
        "halves instead of (N − 1) whole buffers. Split the root k ways and it falls k-fold; with "
        "k = N roots, each reducing 1/N of the buffer, you have reduce-scatter + all-gather — "
        "the idea the ring builds on.",
    hints=("What sets the naive all-reduce's time: the total bytes, or the bytes on the busiest "
           "link?",
           "Count what rank 0 receives and sends now: a half-buffer from each of the N − 1 "
           "others, and a half-buffer back to each."))
