"""Replaying a ring all-reduce's traffic: the first message, step or chunk that is not a ring's."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import numpy as np

from ..comm.errors import CollectiveTimeout
from .harness import ranks_text, result_problem


def ring_explain(n: int):
    """explain(trace, error) for run_learner: what a ring's traffic says went wrong."""

    def explain(trace, error) -> str | None:
        for e in trace.events:
            if e.dst != (e.src + 1) % n:
                return (f"rank {e.src} had sent a message to rank {e.dst}: in a ring each rank "
                        f"sends only to its right neighbour, (rank + 1) % N, and receives from its "
                        f"left, (rank − 1) % N.")
        text = str(error)
        if "broadcast together" in text:
            return ("the chunk you received and the piece you add it to have different lengths: "
                    "add it into the piece with the same index, pieces[(rank − step − 2) % N].")
        if "cannot reshape" in text:
            return ("your pieces no longer add up to x's size: in all-gather, store each received "
                    "chunk at pieces[(rank − step − 1) % N], where a chunk of its size belongs.")
        if not isinstance(error, CollectiveTimeout):
            return None
        counts = Counter(e.src for e in trace.events)
        short = [r for r in range(n) if counts[r] < 2 * (n - 1)]
        return ("In a ring, rank r sends to (r + 1) % N and receives from (r − 1) % N, with the "
                "same tag on both sides, once per step"
                + (f"; rank(s) {short} sent fewer than 2(N−1) = {2 * (n - 1)} messages."
                   if short else "."))
    return explain


def _expected_owner_offset(first_chunks: list[int | None], n: int) -> int:
    """The chunk numbering the learner's ring uses: 0 if rank r sends chunk (r − 1) % N first, as in
    the lesson.

    A ring that starts every rank one chunk further along is just as correct; take the offset most
    ranks use.
    """
    votes = Counter((c - r + 1) % n for r, c in enumerate(first_chunks) if c is not None)
    if not votes or votes[0] == max(votes.values()):
        return 0
    return votes.most_common(1)[0][0]


def _chunk_bounds(reports, n: int, size: int) -> list[tuple[int, int]]:
    """(start, length) of each chunk: as the learner cut them (from the step-0 messages) or as
    np.array_split does."""
    first = sorted({(s[0][3], s[0][1] // 8) for s in (r["sends"] for r in reports)
                    if s and s[0][3] is not None})
    tiles = (len(first) == n and first[0][0] == 0 and first[-1][0] + first[-1][1] == size
             and all(a + k == b for (a, k), (b, _) in pairwise(first)))
    if tiles:
        return first
    lengths = [len(p) for p in np.array_split(np.empty(size), n)]
    return [(int(sum(lengths[:c])), lengths[c]) for c in range(n)]


def ring_problem(reports, n: int, shape) -> str | None:
    """The first thing wrong with a ring all-reduce's traffic (in step order), results or inputs;
    None if nothing."""
    size, steps = int(np.prod(shape)), 2 * (n - 1)
    sends = [r["sends"] for r in reports]
    for j in range(max(map(len, sends))):  # where each message goes, in the order they were sent
        for r in range(n):
            if j < len(sends[r]) and sends[r][j][0] != (r + 1) % n:
                return (f"rank {r} sent message {j + 1} to rank {sends[r][j][0]}: in a ring each "
                        f"rank sends only to its right neighbour, (rank + 1) % N = {(r + 1) % n}, "
                        f"and receives from its left, (rank − 1) % N = {(r - 1) % n}.")
    for r in range(n):
        m = len(sends[r])
        if m != steps:
            why = {2 * n: " Do your loops run range(N) times instead of range(N − 1)?",
                   n - 1: " That is one phase: after N − 1 steps of reduce-scatter come N − 1 of "
                          "all-gather.",
                   0: " Send with comm.sendrecv(right, chunk, left, tag)."}.get(m, "")
            return (f"rank {r} sent {m} messages; a ring all-reduce sends 2(N−1) = {steps}: N − 1 "
                    f"steps of reduce-scatter, then N − 1 of all-gather, one chunk per step.{why}")
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
                return (f"rank {r} sent {dtype} data {where}, but x is float64: "
                        f"send pieces of x's dtype.")
            if nbytes == 0:
                # an empty chunk (x has fewer elements than ranks) carries nothing to check
                continue
            if position is None:
                return (f"the chunk rank {r} sent {where} mixes numbers from different positions: "
                        + ("check that you add the received chunk into the piece with the same "
                           "index, pieces[(rank − step − 2) % N]." if reducing else
                           "check that you store each received chunk at "
                           "pieces[(rank − step − 1) % N]."))
            c = chunk_of.get((position, nbytes // 8))
            if c is None:
                return (f"rank {r} sent elements {position}..{position + nbytes // 8 - 1} {where}: "
                        f"that is not one of the N chunks (np.array_split(x, N) gives starts "
                        f"{[b[0] for b in bounds]}). Send one whole chunk per step.")
            want = (r - step - 1 + k) % n if reducing else (r - step + k) % n
            if c != want:
                formula = ("(rank − step − 1) % N" if reducing else "(rank − step) % N") \
                    if k == 0 else "one chunk further back each step"
                return (f"rank {r} sends chunk {c} at step {step} of {phase} but should send chunk "
                        f"{want}: check the index you send ({formula}).")
            expected = tuple(int((r - q) % n <= step) for q in range(n)) if reducing else everyone
            if counts != expected:
                return (f"rank {r} sent chunk {c} {where} holding {ranks_text(counts)}, "
                        + _content_hint(counts, expected, r, reducing))
    for r in range(n):
        problem = result_problem(r, reports[r]["result"], n, shape)
        if problem:
            return problem + (" Your messages were right, so check that you store each chunk you "
                              "receive in all-gather at pieces[(rank − step − 1) % N] and join the "
                              "pieces in order."
                              if reports[r]["result"]["kind"] == "wrong" else "")
    return _modified(reports)


def _content_hint(counts, expected, r: int, reducing: bool) -> str:
    if not reducing:
        return ("but all-gather forwards finished chunks (every rank's data): check that you store "
                "what arrives at pieces[(rank − step − 1) % N] and forward "
                "pieces[(rank − step) % N].")
    if any(c > 1 for c in counts):
        return (f"but it should hold {ranks_text(expected)}, each once: some data was added twice "
                f"— add each received chunk once, into pieces[(rank − step − 2) % N].")
    if counts[r] == 0:
        return (f"but it should hold {ranks_text(expected)}: rank {r}'s own data is missing — add "
                f"the received chunk to your piece (+=) instead of replacing it.")
    return (f"but it should hold {ranks_text(expected)}: check that you reduce the received chunk "
            f"into the right place, pieces[(rank − step − 2) % N].")


def _modified(reports) -> str | None:
    for r, report in enumerate(reports):
        if report["modified"]:
            return (f"rank {r}'s input x changed during your all-reduce: np.array_split(x, N) "
                    f"returns views of x, so += on a piece writes into x. Split a copy: "
                    f"np.array_split(x.reshape(-1).copy(), N).")
    return None


def pipelined_problem(reports, trace, n: int, shape, segments: int) -> str | None:
    """The first thing wrong with a ring that sends every chunk as `segments` messages."""
    for r, report in enumerate(reports):
        for dst, *_ in report["sends"]:
            if dst != (r + 1) % n:
                return (f"rank {r} sent a message to rank {dst}: in a ring each rank sends only to "
                        f"(rank + 1) % N.")
    for r, report in enumerate(reports):
        m, want = len(report["sends"]), 2 * (n - 1) * segments
        if m != want:
            extra = " That is the plain ring: send each chunk as segments, one message each." \
                if m == 2 * (n - 1) else ""
            return (f"rank {r} sent {m} messages; with every chunk cut into {segments} segments it "
                    f"sends 2(N−1)·{segments} = {want}.{extra}")
    total, s = sum(e.nbytes for e in trace.events), int(np.prod(shape)) * 8
    if total != 2 * (n - 1) * s:
        return (f"all ranks together sent {total} bytes; a ring sends every chunk N − 1 times in "
                f"each phase, 2(N−1)·S = {2 * (n - 1) * s} in all. Segments split a chunk, they "
                f"don't add bytes.")
    for r in range(n):
        problem = result_problem(r, reports[r]["result"], n, shape)
        if problem:
            return problem + (" Check that every segment you receive goes back into the same "
                              "place of the same chunk."
                              if reports[r]["result"]["kind"] == "wrong" else "")
    return _modified(reports)
