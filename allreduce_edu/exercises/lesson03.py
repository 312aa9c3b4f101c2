"""Lesson 03 · ring all-reduce: predict who owns a chunk, write the ring on real ranks, count and
pipeline it.

`check_ring_allreduce` replays your ring's messages step by step and names the first rank, step
and chunk that differ from a ring all-reduce: harness.py gives the inputs that say where every
number came from and the `Spy` comm that writes down what each message carried, ring_traffic.py
the replay.
"""

from __future__ import annotations

import numpy as np

from ..runtime import Cluster
from .feedback import Feedback, failed, passed
from .harness import run_learner, time_allreduce  # noqa: F401 - time_allreduce: for the notebook
from .lesson03_questions import check_owner_prediction  # noqa: F401 - the notebook imports it here
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - notebook
from .ring_traffic import pipelined_problem, ring_explain, ring_problem
from .spec import MIB, Blank, Slip, choice, number

RING_SOLUTION = """def my_ring_allreduce(comm, x):
    n, r = comm.world_size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    pieces = np.array_split(x.reshape(-1).copy(), n)     # N chunks of a copy: x itself stays \
as it was
    for step in range(n - 1):                            # reduce-scatter
        # send chunk (r - step - 1) % n to the right, add the chunk arriving from the left into \
its own piece
        out, into = (r - step - 1) % n, (r - step - 2) % n
        pieces[into] += comm.sendrecv(right, pieces[out], left, tag="reduce_scatter")
    for step in range(n - 1):                            # all-gather: rank r starts with \
finished chunk r
        # forward chunk (r - step) % n to the right, store the chunk arriving from the left
        out, into = (r - step) % n, (r - step - 1) % n
        pieces[into] = comm.sendrecv(right, pieces[out], left, tag="all_gather")
    return np.concatenate(pieces).reshape(x.shape)"""

PIPELINED_SOLUTION = """def my_pipelined_ring(comm, x, segments=2):
    n, r = comm.world_size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    pieces = [np.array_split(p, segments) for p in np.array_split(x.reshape(-1).copy(), n)]
    for step in range(n - 1):
        out, into = (r - step - 1) % n, (r - step - 2) % n
        sends = [comm.isend(right, seg, tag="reduce_scatter") for seg in pieces[out]]   # every \
segment leaves now
        for seg in pieces[into]:
            seg += comm.recv(left, tag="reduce_scatter")   # add segment k while segment k + 1 is \
still arriving
        for request in sends:
            request.wait()
    for step in range(n - 1):
        out, into = (r - step) % n, (r - step - 1) % n
        sends = [comm.isend(right, seg, tag="all_gather") for seg in pieces[out]]
        pieces[into] = [comm.recv(left, tag="all_gather") for _ in range(segments)]
        for request in sends:
            request.wait()
    return np.concatenate([np.concatenate(p) for p in pieces]).reshape(x.shape)"""


@exercise(
    "03.1", "write the ring all-reduce", kind="code", function="my_ring_allreduce",
    library=("collectives.ring:allreduce_ring", "collectives.ring:reduce_scatter_ring",
             "collectives.ring:all_gather_ring"),
    solution=RING_SOLUTION,
    hints=("Start from the lesson's still of step 0: x cut into N chunks, one per rank, and in "
           "every step each rank hands one chunk to its right neighbour while another arrives "
           "from its left. Work on a copy of x cut into N chunks (they may differ in length by "
           "one element), so the caller's x stays as it was.",
           "Two phases of N − 1 steps each, every step one exchange: send right, receive from "
           "the left. In reduce-scatter you add what arrives into your copy of that chunk; in "
           "all-gather what arrives replaces your copy. Between the phases rank r owns the "
           "finished chunk r.",
           "Reduce-scatter's index rule: in step s (counting from 0) rank r sends chunk "
           "(r − s − 1) % N, and what arrives from the left is chunk (r − s − 2) % N, the one "
           "the left neighbour sent; add it in. After N − 1 steps rank r holds chunk r complete.",
           "All-gather's index rule: in its first step each rank sends the chunk it just "
           "finished, its own chunk r, and in every later step it sends the chunk it received "
           "in the step before. So in all-gather step s rank r sends chunk (r − s) % N and "
           "stores the arrival as chunk (r − s − 1) % N: one index ahead of reduce-scatter's.",
           'The key idea: each chunk travels once around the ring twice over. In reduce-scatter a '
           "chunk picks up one rank's data per hop until its owner finishes it; in all-gather each"
           ' finished chunk is forwarded, unchanged, until every rank has a copy, stored instead '
           'of added.'),
    key="""from allreduce_edu.exercises.lesson03 import check_ring_allreduce

""" + RING_SOLUTION + """

check_ring_allreduce(my_ring_allreduce)""")
def check_ring_allreduce(fn, world_sizes=(3, 4), shapes=((10,), (1_000_003,), (2, 5)),
                         timeout: float = 20.0, transport: str = "grpc") -> Feedback:
    """Exercise 03.1: `fn(comm, x)` must be a ring all-reduce (sum) built from
    comm.sendrecv/send/recv.

    Runs on real gRPC ranks of each world size, with each shape; replays every rank's messages in
    step order and reports the first that differs from the ring's, then checks results and inputs.
    transport="local" runs the same checks on thread ranks (the tests use it for quick wrong
    answers).
    """
    sent = {}
    for n in world_sizes:
        with Cluster(n, transport, timeout=timeout) as cluster:
            for shape in shapes:
                reports, error = run_learner(cluster, fn, shape, ("send", "recv", "sendrecv"),
                                             ring_explain(n))
                if error is not None:
                    return error
                problem = ring_problem(reports, n, shape)
                if problem:
                    return failed(f"{n} ranks, x of shape {shape}: {problem}")
                sent[n, shape] = cluster.trace.bytes_sent()
    n, shape = max(world_sizes), max(shapes, key=lambda s: int(np.prod(s)))
    s = int(np.prod(shape)) * 8
    return passed(f"your ring matches NumPy on {' and '.join(map(str, world_sizes))} gRPC ranks, "
                  f"for x of shapes {', '.join(map(str, shapes))}; every rank sent 2(N−1) chunks, "
                  f"only to its right neighbour. With {n} ranks and S = {s} bytes, rank 0 sent "
                  f"{sent[n, shape][0]} bytes; 2(N−1)/N·S = {2 * (n - 1) * s / n:.0f} (chunks "
                  f"differ by at most one element).")


check_ring_bytes = number(
    "03.2", "predict the ring's bytes on uneven chunks", module=__name__,
    checker="check_ring_bytes",
    question="x holds 1,000,003 float64 elements (S = 8,000,024 bytes), and N = 16 ranks run "
             "your ring, which cuts x with `np.array_split`. How many bytes does rank 0 send in "
             "all? (1,000,003 does not divide by 16.)",
    blanks=(Blank("my_bytes", "bytes rank 0 sends: your own reasoning, a number or an "
                  "expression", "(30 * 62500 + 4) * 8"),),
    inputs={"world_size": 16, "count": 1_000_003}, unit="bytes", exact=True,
    answer=lambda d: ring_bytes_sent(d.count, d.world_size),
    slips=lambda d: [
        Slip(2 * (d.world_size - 1) / d.world_size * d.count * 8, "that is 2(N − 1)/N·S, the "
             "formula for equal chunks. np.array_split makes the first count % N chunks one "
             "element longer: which chunks does rank 0 send, and how long is each?"),
        Slip(2 * (d.world_size - 1) * (d.count // d.world_size) * 8, "that counts every chunk "
             "as a short one: the first count % N chunks hold one element more."),
        Slip(2 * (d.world_size - 1) * (d.count // d.world_size + 1) * 8, "that counts every "
             "chunk as a long one: only the first count % N chunks hold the extra element."),
        Slip(ring_bytes_sent(d.count, d.world_size) / MIB, "that looks like MiB: answer in "
             "bytes."),
        Slip(2 * d.count * 8, "2·S is the limit as N grows; each rank sends 2(N − 1) chunks, a "
             "little less."),
        Slip((d.world_size - 1) * d.count * 8, "(N − 1)·S is what the naive root sends; a ring "
             "rank sends chunks, not whole buffers."),
        Slip(2 * (d.world_size - 1), "that is the number of messages; add up the bytes of each."),
    ],
    otherwise="list the 2(N − 1) chunks rank 0 sends (N − 1 in each phase), the length of each "
              "from np.array_split, and add them up, 8 bytes an element.",
    success=lambda d: f"{ring_bytes_sent(d.count, d.world_size)} bytes: rank 0 sends every chunk "
                      f"but its own in reduce-scatter and every chunk but chunk 1 in all-gather; "
                      f"4 of those 30 are the long ones. 2(N−1)/N·S = "
                      f"{2 * (d.world_size - 1) / d.world_size * d.count * 8:.0f} is the same "
                      f"to within one element per chunk — the bound holds for any size.",
    hints=("Count messages first: a rank sends N − 1 chunks in reduce-scatter and N − 1 in "
           "all-gather. Which chunk indices does rank 0 send in each phase?",
           "np.array_split(x, 16) on 1,000,003 elements gives 3 chunks of 62,501 (chunks 0, 1, 2) "
           "and 13 of 62,500. Rank 0 sends chunks (0 − s − 1) % N in reduce-scatter step s and "
           "(0 − s) % N in all-gather step s."),
    solution="""Rank 0 sends chunks 15, 14, …, 1 in reduce-scatter (all but chunk 0) and chunks
0, 15, …, 2 in all-gather (all but chunk 1). np.array_split makes chunks 0, 1 and 2 one element
longer (62,501; the other 13 hold 62,500), and rank 0 sends two of them in each phase:
    (30 × 62,500 + 4) × 8 = 15,000,032 bytes
2(N − 1)/N·S = 15,000,045 — within one element per chunk.""")


def ring_bytes_sent(count: int, world_size: int, rank: int = 0, itemsize: int = 8) -> int:
    """Bytes `rank` sends in a ring all-reduce of `count` elements cut by np.array_split."""
    n = world_size
    q, extra = divmod(count, n)
    size = lambda chunk: (q + (chunk % n < extra)) * itemsize  # noqa: E731 - np.array_split's
    return sum(size(rank - s - 1) + size(rank - s) for s in range(n - 1))


@exercise(
    "03.3", "pipeline the ring in segments", kind="code", function="my_pipelined_ring",
    library=(),
    solution=PIPELINED_SOLUTION,
    explanation="""Same bytes, twice the messages. On a GPU cluster segments let the reduction of \
one overlap the transfer
of the next (NCCL cuts every chunk into slices for this). Here the additions are cheap next to \
gRPC's per-byte
CPU cost, and every extra message costs another α, so expect no gain — often a small loss.""",
    hints=("Start from your ring: which chunk goes where in which step does not change. What "
           "changes is that each chunk now travels as several smaller messages, its segments.",
           "Cut every chunk once more into segments parts, the same way you cut x into chunks. "
           "In each step, first start every segment of the outgoing chunk with the non-blocking "
           "send, then receive the incoming segments one at a time, then wait until your sends "
           "are done.",
           "A non-blocking send returns at once with a request; keep the requests and wait on "
           "each before the next step. In reduce-scatter add each arriving segment into the "
           "matching segment of your chunk; in all-gather store them.",
           "The key idea: the ring's schedule does not change, only the size of what moves. Every "
           'segment of a chunk leaves before you wait for any, so segment k + 1 is on the wire '
           'while you add segment k; all-gather forwards the segments the same way.'),
    key="""from allreduce_edu.exercises.lesson03 import check_pipelined_ring

""" + PIPELINED_SOLUTION + """

check_pipelined_ring(my_pipelined_ring)""")
def check_pipelined_ring(fn, world_sizes=(3,), shapes=((10,), (100_003,)), segments: int = 2,
                         timeout: float = 20.0, transport: str = "grpc") -> Feedback:
    """Exercise 03.3: a ring that sends every chunk as `segments` messages; still correct, same
    bytes."""
    for n in world_sizes:
        with Cluster(n, transport, timeout=timeout) as cluster:
            for shape in shapes:
                reports, error = run_learner(cluster, fn, shape,
                                             ("send", "recv", "sendrecv", "isend"),
                                             ring_explain(n))
                if error is not None:
                    return error
                problem = pipelined_problem(reports, cluster.trace, n, shape, segments)
                if problem:
                    return failed(f"{n} ranks, x of shape {shape}: {problem}")
    return passed(f"still a correct ring: every rank sent {2 * (n - 1) * segments} messages of "
                  f"about S/({segments}N) bytes — {segments}× the messages, the same 2(N−1)/N·S "
                  f"bytes.")


check_busbw_answer = choice(
    "03.4", "the ring on 64 ranks instead of 8", module=__name__, checker="check_busbw_answer",
    question="A ring all-reduce of S = 1 GiB runs on 8 ranks, then on 64, every rank with its "
             "own 100 Gb/s link; at this size bytes, not α, set the time. On 64 ranks it takes",
    options={
        "a": "about 9× as long: each rank now takes 126 steps instead of 14.",
        "b": "about 8× less: each rank's chunk is 16 MiB instead of 128 MiB.",
        "c": "exactly as long: every rank sends 2·S = 2 GiB, whatever N is.",
        "d": "about 1.1× as long: each rank sends 1.97 GiB instead of 1.75.",
    },
    right="d",
    slips={
        "a": "there are 9× as many steps, but the chunks also shrink to S/N, and all links work "
             "at once. Count the bytes one rank sends: 2(N − 1) chunks of S/N.",
        "b": "each chunk is 1/8 the size, but there are 9× as many steps (126, not 14). "
             "Multiply: 2(N − 1) chunks of S/N bytes.",
        "c": "close, but not exactly: 2(N − 1)/N·S approaches 2·S as N grows, from below, and "
             "never reaches it. Work it out for N = 8 and N = 64.",
    },
    why="each rank sends 2(N − 1)/N·S: 2·7/8 = 1.75 GiB on 8 ranks, 2·63/64 ≈ 1.97 GiB on 64, "
        "so the time grows by 1.97/1.75 ≈ 1.125 while the world grows 8×. That is why busbw, "
        "algbw·2(N − 1)/N, stays near the link speed at any N; only the 2(N − 1)·α term grows, "
        "which matters for small messages.",
    hints=("What does one rank send in a ring all-reduce: how many chunks, of what size?",
           "Work out 2(N − 1)/N·S for N = 8 and N = 64, and take the ratio."))
