"""Lesson 03 · ring all-reduce: predict who owns a chunk, write the ring on real ranks, count and pipeline it.

`check_ring_allreduce` replays your ring's messages step by step (see lesson02.py for how it knows what
each message carried) and names the first rank, step and chunk that differ from a ring all-reduce.
"""

from __future__ import annotations

import time
from collections import Counter
from itertools import pairwise

import numpy as np

from ..runtime import Cluster
from ..comm.errors import CollectiveTimeout
from .feedback import Feedback, failed, multiple_choice, passed
from .harness import ranks_text, result_problem, run_learner
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - for the notebook

RING_SOLUTION = """def my_ring_allreduce(comm, x):
    n, r = comm.world_size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    pieces = np.array_split(x.reshape(-1).copy(), n)     # N chunks of a copy: x itself stays as it was
    for step in range(n - 1):                            # reduce-scatter
        # send chunk (r - step - 1) % n to the right, add the chunk arriving from the left into its own piece
        out, into = (r - step - 1) % n, (r - step - 2) % n
        pieces[into] += comm.sendrecv(right, pieces[out], left, tag="reduce_scatter")
    for step in range(n - 1):                            # all-gather: rank r starts with finished chunk r
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
        sends = [comm.isend(right, seg, tag="reduce_scatter") for seg in pieces[out]]   # every segment leaves now
        for seg in pieces[into]:
            seg += comm.recv(left, tag="reduce_scatter")   # add segment k while segment k + 1 is still arriving
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
    "03.0", "who owns the finished chunk 2", kind="number",
    todo="replace None with the rank (0 to 3) that holds the finished chunk 2, then run this cell again.",
    hints=("Chunk 2 starts its trip on the rank that sends it at step 0: rank r sends chunk (r − 1) % N first.",
           "Follow chunk 2 one hop to the right per step; reduce-scatter has N − 1 = 3 steps."),
    solution="""Rank 2. In reduce-scatter step s, rank r sends chunk (r - s - 1) % N to the right. Chunk 2 starts on
rank 3 (step 0: (3 - 0 - 1) % 4 = 2), goes 3 → 0 → 1 → 2 collecting one rank's data per hop, and the last hop
lands on rank 2: after reduce-scatter rank r owns finished chunk r.""",
    key="""from allreduce_edu.exercises.lesson03 import check_owner_prediction, hint, solution

my_owner = 2   # which rank owns finished chunk 2 after reduce-scatter?
check_owner_prediction(my_owner)""")


def check_owner_prediction(rank, world_size: int = 4, chunk: int = 2) -> Feedback:
    """Prediction 03.0: after reduce-scatter on 4 ranks, which rank holds the finished chunk 2?"""
    try:
        rank = int(rank)
    except (TypeError, ValueError):
        return failed("answer with a rank number, 0 to 3.")
    if not 0 <= rank < world_size:
        return failed(f"there are {world_size} ranks, numbered 0 to {world_size - 1}.")
    if rank == chunk:
        return passed(f"rank {chunk}: chunk {chunk} starts on rank {(chunk + 1) % world_size} and travels "
                      f"{' → '.join(str((chunk + 1 + h) % world_size) for h in range(world_size))}, picking up one "
                      f"rank's data per hop; after reduce-scatter rank r owns finished chunk r.")
    first = (chunk + 1) % world_size
    hints = {
        first: (f"rank {first} is where chunk {chunk} starts (step 0: rank r sends chunk (r − 1) % N, and "
                f"({first} − 1) % {world_size} = {chunk}). Follow it around the ring for N − 1 hops."),
        (chunk - 1) % world_size: (f"rank {(chunk - 1) % world_size} sends chunk {chunk} in the last step — "
                                   f"to its right neighbour, which adds its own part and holds the finished chunk."),
    }
    return failed(hints.get(rank, f"rank {rank} never holds chunk {chunk} finished: in step s rank r sends "
                                  f"chunk (r − s − 1) % N to rank r + 1. Follow chunk {chunk} hop by hop."))


@exercise(
    "03.1", "write the ring all-reduce", kind="code", function="my_ring_allreduce", solution=RING_SOLUTION,
    hints=("Cut a copy of x into N chunks: pieces = np.array_split(x.reshape(-1).copy(), n). Chunks may differ "
           "in length by one, and the copy keeps x unchanged.",
           "Two loops of N − 1 steps. In reduce-scatter step s, rank r sends pieces[(r − s − 1) % n] to the right "
           "and adds what arrives from the left into pieces[(r − s − 2) % n]; afterwards rank r owns chunk r.",
           "In all-gather step s, rank r forwards pieces[(r − s) % n] and stores what arrives in "
           "pieces[(r − s − 1) % n]: pieces[into] = comm.sendrecv(right, pieces[out], left, tag=\"all_gather\"). "
           "Finish with np.concatenate(pieces).reshape(x.shape)."),
    key="""from allreduce_edu.exercises.lesson03 import check_ring_allreduce

""" + RING_SOLUTION + """

check_ring_allreduce(my_ring_allreduce)""")
def check_ring_allreduce(fn, world_sizes=(3, 4), shapes=((10,), (1_000_003,), (2, 5)),
                         timeout: float = 20.0, transport: str = "grpc") -> Feedback:
    """Exercise 03.1: `fn(comm, x)` must be a ring all-reduce (sum) built from comm.sendrecv/send/recv.

    Runs on real gRPC ranks of each world size, with each shape; replays every rank's messages in step
    order and reports the first that differs from the ring's, then checks results and inputs.
    transport="local" runs the same checks on thread ranks (the tests use it for quick wrong answers).
    """
    sent = {}
    for n in world_sizes:
        with Cluster(n, transport, timeout=timeout) as cluster:
            for shape in shapes:
                reports, error = run_learner(cluster, fn, shape, ("send", "recv", "sendrecv"), _ring_explain(n))
                if error is not None:
                    return error
                problem = _ring_problem(reports, n, shape)
                if problem:
                    return failed(f"{n} ranks, x of shape {shape}: {problem}")
                sent[n, shape] = cluster.trace.bytes_sent()
    n, shape = max(world_sizes), max(shapes, key=lambda s: int(np.prod(s)))
    s = int(np.prod(shape)) * 8
    return passed(f"your ring matches NumPy on {' and '.join(map(str, world_sizes))} gRPC ranks, for x of shapes "
                  f"{', '.join(map(str, shapes))}; every rank sent 2(N−1) chunks, only to its right neighbour. "
                  f"With {n} ranks and S = {s} bytes, rank 0 sent {sent[n, shape][0]} bytes; "
                  f"2(N−1)/N·S = {2 * (n - 1) * s / n:.0f} (chunks differ by at most one element).")


def _ring_explain(n: int):
    def explain(trace, error) -> str | None:
        for e in trace.events:
            if e.dst != (e.src + 1) % n:
                return (f"rank {e.src} had sent a message to rank {e.dst}: in a ring each rank sends only to its "
                        f"right neighbour, (rank + 1) % N, and receives from its left, (rank − 1) % N.")
        text = str(error)
        if "broadcast together" in text:
            return ("the chunk you received and the piece you add it to have different lengths: add it into the "
                    "piece with the same index, pieces[(rank − step − 2) % N].")
        if "cannot reshape" in text:
            return ("your pieces no longer add up to x's size: in all-gather, store each received chunk at "
                    "pieces[(rank − step − 1) % N], where a chunk of its size belongs.")
        if not isinstance(error, CollectiveTimeout):
            return None
        counts = Counter(e.src for e in trace.events)
        short = [r for r in range(n) if counts[r] < 2 * (n - 1)]
        return ("In a ring, rank r sends to (r + 1) % N and receives from (r − 1) % N, with the same tag on both "
                "sides, once per step" + (f"; rank(s) {short} sent fewer than 2(N−1) = {2 * (n - 1)} messages."
                                          if short else "."))
    return explain


def _expected_owner_offset(first_chunks: list[int | None], n: int) -> int:
    """The chunk numbering the learner's ring uses: 0 if rank r sends chunk (r − 1) % N first, as in the lesson.

    A ring that starts every rank one chunk further along is just as correct; take the offset most ranks use.
    """
    votes = Counter((c - r + 1) % n for r, c in enumerate(first_chunks) if c is not None)
    if not votes or votes[0] == max(votes.values()):
        return 0
    return votes.most_common(1)[0][0]


def _chunk_bounds(reports, n: int, size: int) -> list[tuple[int, int]]:
    """(start, length) of each chunk: as the learner cut them (from the step-0 messages) or as np.array_split does."""
    first = sorted({(s[0][3], s[0][1] // 8) for s in (r["sends"] for r in reports) if s and s[0][3] is not None})
    tiles = (len(first) == n and first[0][0] == 0 and first[-1][0] + first[-1][1] == size
             and all(a + k == b for (a, k), (b, _) in pairwise(first)))
    if tiles:
        return first
    lengths = [len(p) for p in np.array_split(np.empty(size), n)]
    return [(int(sum(lengths[:c])), lengths[c]) for c in range(n)]


def _ring_problem(reports, n: int, shape) -> str | None:
    """The first thing wrong with a ring all-reduce's traffic (in step order), results or inputs; None if nothing."""
    size, steps = int(np.prod(shape)), 2 * (n - 1)
    sends = [r["sends"] for r in reports]
    for j in range(max(map(len, sends))):  # where each message goes, in the order they were sent
        for r in range(n):
            if j < len(sends[r]) and sends[r][j][0] != (r + 1) % n:
                return (f"rank {r} sent message {j + 1} to rank {sends[r][j][0]}: in a ring each rank sends only to "
                        f"its right neighbour, (rank + 1) % N = {(r + 1) % n}, and receives from its left, "
                        f"(rank − 1) % N = {(r - 1) % n}.")
    for r in range(n):
        m = len(sends[r])
        if m != steps:
            why = {2 * n: " Do your loops run range(N) times instead of range(N − 1)?",
                   n - 1: " That is one phase: after N − 1 steps of reduce-scatter come N − 1 of all-gather.",
                   0: " Send with comm.sendrecv(right, chunk, left, tag)."}.get(m, "")
            return (f"rank {r} sent {m} messages; a ring all-reduce sends 2(N−1) = {steps}: N − 1 steps of "
                    f"reduce-scatter, then N − 1 of all-gather, one chunk per step.{why}")
    bounds = _chunk_bounds(reports, n, size)
    chunk_of = {b: c for c, b in enumerate(bounds)}
    first = [chunk_of.get((s[0][3], s[0][1] // 8)) for s in sends]
    k = _expected_owner_offset(first, n)
    everyone = (1,) * n
    for j in range(steps):
        reducing, step = j < n - 1, j if j < n - 1 else j - (n - 1)
        phase = "reduce-scatter" if reducing else "all-gather"
        for r in range(n):
            _, nbytes, dtype, position, counts = sends[r][j]
            where = f"at step {step} of {phase}"
            if dtype != "float64":
                return f"rank {r} sent {dtype} data {where}, but x is float64: send pieces of x's dtype."
            if nbytes == 0:
                continue  # an empty chunk (x has fewer elements than ranks) carries nothing to check
            if position is None:
                return (f"the chunk rank {r} sent {where} mixes numbers from different positions: "
                        + ("check that you add the received chunk into the piece with the same index, "
                           "pieces[(rank − step − 2) % N]." if reducing else
                           "check that you store each received chunk at pieces[(rank − step − 1) % N]."))
            c = chunk_of.get((position, nbytes // 8))
            if c is None:
                return (f"rank {r} sent elements {position}..{position + nbytes // 8 - 1} {where}: that is not one "
                        f"of the N chunks (np.array_split(x, N) gives starts {[b[0] for b in bounds]}). Send one "
                        f"whole chunk per step.")
            want = (r - step - 1 + k) % n if reducing else (r - step + k) % n
            if c != want:
                formula = ("(rank − step − 1) % N" if reducing else "(rank − step) % N") if k == 0 else \
                    "one chunk further back each step"
                return (f"rank {r} sends chunk {c} at step {step} of {phase} but should send chunk {want}: check "
                        f"the index you send ({formula}).")
            expected = tuple(int((r - q) % n <= step) for q in range(n)) if reducing else everyone
            if counts != expected:
                return f"rank {r} sent chunk {c} {where} holding {ranks_text(counts)}, " + _content_hint(
                    counts, expected, r, reducing)
    for r in range(n):
        problem = result_problem(r, reports[r]["result"], n, shape)
        if problem:
            return problem + (" Your messages were right, so check that you store each chunk you receive in "
                              "all-gather at pieces[(rank − step − 1) % N] and join the pieces in order."
                              if reports[r]["result"]["kind"] == "wrong" else "")
    return _modified(reports)


def _content_hint(counts, expected, r: int, reducing: bool) -> str:
    if not reducing:
        return ("but all-gather forwards finished chunks (every rank's data): check that you store what arrives "
                "at pieces[(rank − step − 1) % N] and forward pieces[(rank − step) % N].")
    if any(c > 1 for c in counts):
        return (f"but it should hold {ranks_text(expected)}, each once: some data was added twice — add each "
                f"received chunk once, into pieces[(rank − step − 2) % N].")
    if counts[r] == 0:
        return (f"but it should hold {ranks_text(expected)}: rank {r}'s own data is missing — add the received "
                f"chunk to your piece (+=) instead of replacing it.")
    return (f"but it should hold {ranks_text(expected)}: check that you reduce the received chunk into the "
            f"right place, pieces[(rank − step − 2) % N].")


def _modified(reports) -> str | None:
    for r, report in enumerate(reports):
        if report["modified"]:
            return (f"rank {r}'s input x changed during your all-reduce: np.array_split(x, N) returns views of x, so "
                    f"+= on a piece writes into x. Split a copy: np.array_split(x.reshape(-1).copy(), N).")
    return None


@exercise(
    "03.2", "predict the ring's bytes per rank", kind="number",
    todo="replace None with the number of bytes rank 0 sends, then run this cell again.",
    hints=("Count messages first: how many steps has each phase, and how many chunks does a rank send per step?",
           "Each message is one chunk of S/N bytes; a rank sends N − 1 of them in each of the two phases."),
    solution="""Each rank sends 2(N - 1) chunks of S/N bytes: N - 1 in reduce-scatter, N - 1 in all-gather.
    2 * (N - 1) / N * S = 2 * 7 / 8 * 1048576 = 1835008 bytes   (1.75 MiB)
(1 MiB divides into 8 equal chunks, so this is exact.)""",
    key="""from allreduce_edu.exercises.lesson03 import check_ring_bytes

my_bytes = 2 * (8 - 1) * (1 << 20) // 8   # 2(N − 1) chunks of S/N bytes
check_ring_bytes(my_bytes)""")
def check_ring_bytes(answer, world_size: int = 8, nbytes: int = 1 << 20) -> Feedback:
    """Exercise 03.2: bytes rank 0 sends in one ring all-reduce of S = 1 MiB on N = 8 ranks."""
    try:
        answer = float(answer)
    except (TypeError, ValueError):
        return failed("answer with a number of bytes.")
    n, s = world_size, nbytes
    expected = 2 * (n - 1) * s // n
    if answer == expected:
        return passed(f"2(N−1)/N·S = 2·{n - 1}/{n} × {s} = {expected} bytes ({expected / (1 << 20):g} MiB): "
                      f"{2 * (n - 1)} chunks of S/N = {s // n} bytes. The naive root would send {(n - 1) * s}.")
    hints = {
        expected / (1 << 20): "that looks like MiB: answer in bytes.",
        2 * s: "2·S is the limit as N grows; with N = 8 each rank sends 2(N−1) chunks of S/N, a little less.",
        (n - 1) * s // n: "that is reduce-scatter alone: all-gather sends as many bytes again.",
        (n - 1) * s: "(N−1)·S is what the naive root sends; a ring rank sends chunks of S/N, not whole buffers.",
        s // n: "that is one chunk, S/N: how many chunks does a rank send over both phases?",
        2 * (n - 1): "that is the number of messages; multiply by the bytes in each, S/N.",
        2 * (n - 1) * s: "each message is one chunk of S/N bytes, not the whole buffer.",
    }
    return failed(hints.get(answer, f"{answer:g} bytes is not it: a rank sends N − 1 chunks in reduce-scatter and "
                                    f"N − 1 in all-gather, each S/N bytes."))


@exercise(
    "03.3", "pipeline the ring in segments", kind="code", function="my_pipelined_ring",
    solution=PIPELINED_SOLUTION,
    explanation="""Same bytes, twice the messages. On a GPU cluster segments let the reduction of one overlap the transfer
of the next (NCCL cuts every chunk into slices for this). Here the additions are cheap next to gRPC's per-byte
CPU cost, and every extra message costs another α, so expect no gain — often a small loss.""",
    hints=("Start from your ring, and cut every chunk once more: "
           "pieces = [np.array_split(p, segments) for p in np.array_split(x.reshape(-1).copy(), n)].",
           "In each step, start every segment of the outgoing chunk with sends = [comm.isend(right, seg, tag) ...], "
           "then recv the incoming segments one at a time (seg += comm.recv(left, tag)), then wait on every send.",
           "All-gather the same way: isend each segment of pieces[out], then "
           "pieces[into] = [comm.recv(left, tag) for _ in range(segments)]; join with two np.concatenate calls."),
    key="""from allreduce_edu.exercises.lesson03 import check_pipelined_ring

""" + PIPELINED_SOLUTION + """

check_pipelined_ring(my_pipelined_ring)""")
def check_pipelined_ring(fn, world_sizes=(3,), shapes=((10,), (100_003,)), segments: int = 2,
                         timeout: float = 20.0, transport: str = "grpc") -> Feedback:
    """Exercise 03.3: a ring that sends every chunk as `segments` messages; still correct, same bytes."""
    for n in world_sizes:
        with Cluster(n, transport, timeout=timeout) as cluster:
            for shape in shapes:
                reports, error = run_learner(cluster, fn, shape, ("send", "recv", "sendrecv", "isend"),
                                             _ring_explain(n))
                if error is not None:
                    return error
                problem = _pipelined_problem(reports, cluster.trace, n, shape, segments)
                if problem:
                    return failed(f"{n} ranks, x of shape {shape}: {problem}")
    return passed(f"still a correct ring: every rank sent {2 * (n - 1) * segments} messages of about "
                  f"S/({segments}N) bytes — {segments}× the messages, the same 2(N−1)/N·S bytes.")


def _pipelined_problem(reports, trace, n: int, shape, segments: int) -> str | None:
    for r, report in enumerate(reports):
        for dst, *_ in report["sends"]:
            if dst != (r + 1) % n:
                return f"rank {r} sent a message to rank {dst}: in a ring each rank sends only to (rank + 1) % N."
    for r, report in enumerate(reports):
        m, want = len(report["sends"]), 2 * (n - 1) * segments
        if m != want:
            extra = " That is the plain ring: send each chunk as segments, one message each." \
                if m == 2 * (n - 1) else ""
            return (f"rank {r} sent {m} messages; with every chunk cut into {segments} segments it sends "
                    f"2(N−1)·{segments} = {want}.{extra}")
    total, s = sum(e.nbytes for e in trace.events), int(np.prod(shape)) * 8
    if total != 2 * (n - 1) * s:
        return (f"all ranks together sent {total} bytes; a ring sends every chunk N − 1 times in each phase, "
                f"2(N−1)·S = {2 * (n - 1) * s} in all. Segments split a chunk, they don't add bytes.")
    for r in range(n):
        problem = result_problem(r, reports[r]["result"], n, shape)
        if problem:
            return problem + (" Check that every segment you receive goes back into the same place of the same "
                              "chunk." if reports[r]["result"]["kind"] == "wrong" else "")
    return _modified(reports)


def time_allreduce(cluster, fn, nbytes: int = 4 << 20, reps: int = 5) -> float:
    """Median seconds of `fn(comm, x)` over `reps` runs on every rank of `cluster` (x: `nbytes` of float32).

    A run lasts until its slowest rank is done; one untimed run first warms up the connections.
    """
    per_rank = cluster.run(_timed_runs, fn, nbytes // 4, reps)
    return float(np.median(np.max(per_rank, axis=0)))


def _timed_runs(comm, fn, count: int, reps: int) -> list[float]:
    x = np.ones(count, np.float32)
    fn(comm, x)
    times = []
    for _ in range(reps):
        comm.barrier()
        t0 = time.perf_counter()
        fn(comm, x)
        times.append(time.perf_counter() - t0)
    return times


@exercise(
    "03.4", "why busbw falls with N here", kind="choice",
    hints=("What is busbw = algbw · 2(N − 1)/N built to measure: a property of the algorithm, or of each link?",
           "On this laptop, what do all the rank processes share, and what does gRPC spend on every byte?"),
    solution="""c: busbw = algbw · 2(N-1)/N counts the bytes each rank's link must carry in a ring, 2(N-1)/N·S, and
that is the same load per link for any N: on a network where every rank has its own link, busbw stays
near the link's speed however many ranks you add. Here the "links" are gRPC calls, which cost CPU per byte,
and all N ranks share this machine's cores: more ranks, less CPU for each, lower busbw.""",
    key="""from allreduce_edu.exercises.lesson03 import check_busbw_answer

check_busbw_answer("c")""")
def check_busbw_answer(choice: str) -> Feedback:
    """Exercise 03.4: why busbw should not depend on N, and why here it does (a, b or c)."""
    answers = {
        "a": ("no: a ring's step count does grow with N, but that costs latency (2(N−1)·α), which matters for small "
              "messages. busbw is about big ones, where each rank's bytes, 2(N−1)/N·S, barely change with N."),
        "b": ("no: every rank keeps one connection to each neighbour, and the loopback interface does not slow down "
              "with more of them. Look at what all the ranks share on this machine."),
        "c": "",
    }
    success = ("busbw = algbw · 2(N−1)/N measures what each rank's link carries, which is the same for any N on "
               "a real network. Here the ranks share 2 CPU cores and gRPC spends CPU on every byte, so each "
               "added rank takes CPU from the others.")
    return multiple_choice(choice, answers, right="c", success=success)
