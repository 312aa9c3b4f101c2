"""Lesson 02 · naive all-reduce: write reduce-to-root + broadcast on real ranks; predict the root's bytes.

The checkers here (and lesson03's) run your function on real gRPC ranks with inputs that say where every
number came from: element i of rank r is i·2^27 + 8^r, so any sum of pieces of them tells which ranks it
contains (the base-8 digits below 2^27) and which positions (the part above). A `_Spy` communicator hands
your messages on and writes down what each one carried, so a checker can replay your traffic step by step.
"""

from __future__ import annotations

import re

import cloudpickle
import numpy as np

from ..cluster import Cluster
from ..comm.errors import CollectiveTimeout
from ..worlds import ship
from ._feedback import SOLUTIONS, Feedback, failed, multiple_choice, passed, solution  # noqa: F401 - for the notebook

SOLUTIONS["02.1"] = """def my_naive_allreduce(comm, x):
    if comm.rank != 0:
        comm.send(0, x, tag="reduce")              # 1. everyone sends x to the root ...
        return comm.recv(0, tag="broadcast")       # 4. ... and gets the sum back
    total = x.copy()                               # 2. the root starts from its own x (a copy: x stays as it was)
    for src in range(1, comm.world_size):
        total += comm.recv(src, tag="reduce")      #    and adds the others' in rank order
    for dst in range(1, comm.world_size):
        comm.send(dst, total, tag="broadcast")     # 3. then sends the sum to every other rank
    return total"""

SOLUTIONS["02.2"] = """The root receives one S-byte buffer from each of the other N - 1 ranks and sends the sum back to each:
    sent = received = (N - 1) * S = 7 * 1048576 = 7340032 bytes   (7 MiB each way)
Every other rank sends S = 1 MiB and receives S."""

SOLUTIONS["02.3"] = """a: every byte passes through the root's link, (N - 1)·S in and (N - 1)·S out, while each other rank
moves only S each way. The root's link is busy N - 1 times longer than anyone else's, and that grows with N."""

POSITION = float(1 << 27)  # element i carries i·POSITION (times the number of ranks added into it) ...
DIGIT = 8  # ... plus 8^r for each rank r it contains: base-8 digits count every rank's contributions


def encoded_input(rank: int, shape) -> np.ndarray:
    """The checkers' input on `rank`: element i is i·2^27 + 8^rank (float64; sums stay exact up to ~10^6 elements)."""
    count = int(np.prod(shape, dtype=np.int64))
    return (np.arange(count, dtype=np.float64) * POSITION + float(DIGIT ** rank)).reshape(shape)


def expected_sum(world_size: int, shape) -> np.ndarray:
    """What a sum all-reduce of `encoded_input` over `world_size` ranks gives."""
    return sum(encoded_input(r, shape) for r in range(world_size))


def decode(array, world_size: int) -> tuple[int | None, tuple[int, ...] | None]:
    """(position of the first element, how many times each rank's data is in it) for a piece of encoded data.

    (None, None) when the piece is not float64, is empty, or its elements disagree (pieces of different
    positions were added together, or elements are out of order).
    """
    a = np.asarray(array)
    if a.dtype != np.float64 or a.size == 0:
        return None, None
    v = a.reshape(-1)
    if not (np.all(np.isfinite(v)) and np.all(v >= 0) and np.all(v == np.floor(v))):
        return None, None
    low = np.mod(v, POSITION)
    if not np.all(low == low[0]):
        return None, None
    digits, rest = [], int(low[0])
    for _ in range(world_size):
        rest, digit = divmod(rest, DIGIT)
        digits.append(digit)
    total = sum(digits)
    if rest or total == 0:
        return None, None
    positions = (v - low[0]) / POSITION / total
    if not np.array_equal(positions, positions[0] + np.arange(v.size)):
        return None, None
    return int(positions[0]), tuple(digits)


class _Spy:
    """The comm your function gets: rank, world_size, send, recv, sendrecv (and isend where allowed), forwarded
    to the real Communicator; every send is written down as (dst, nbytes, dtype, first position, ranks' counts)."""

    def __init__(self, comm, allowed=("send", "recv", "sendrecv")):
        self._comm, self._allowed = comm, tuple(allowed)
        self.rank, self.world_size = comm.rank, comm.world_size
        self.sends: list[tuple] = []

    def _note(self, dst, array) -> None:
        a = np.asarray(array)
        self.sends.append((dst, a.nbytes, a.dtype.name, *decode(a, self.world_size)))

    def _check(self, name: str) -> None:
        if name not in self._allowed:
            raise AttributeError(self._refusal(name))

    def _refusal(self, name: str) -> str:
        return (f"comm.{name}, which is not available in this exercise: use only comm.rank, comm.world_size, "
                + ", ".join(f"comm.{a}" for a in self._allowed)
                + ". (Calling one of the library's collectives? Write the algorithm yourself, from messages.)")

    def send(self, dst, array, tag, **kwargs):
        self._check("send")
        self._note(dst, array)
        return self._comm.send(dst, array, tag, **kwargs)

    def isend(self, dst, array, tag, **kwargs):
        self._check("isend")
        self._note(dst, array)
        return self._comm.isend(dst, array, tag, **kwargs)

    def recv(self, src, tag, **kwargs):
        self._check("recv")
        return self._comm.recv(src, tag, **kwargs)

    def sendrecv(self, dst, array, src, tag, **kwargs):
        self._check("sendrecv")
        self._note(dst, array)
        return self._comm.sendrecv(dst, array, src, tag, **kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(self._refusal(name))


def _describe(result, shape, world_size: int) -> dict:
    """What a rank returned, for the checker: ok, or the first thing wrong with it (computed on the rank)."""
    if result is None:
        return {"kind": "none"}
    try:
        y = np.asarray(result)
    except Exception:  # noqa: BLE001 - whatever the learner returned
        return {"kind": "type", "type": type(result).__name__}
    if y.shape != tuple(shape):
        return {"kind": "shape", "shape": y.shape}
    if y.dtype != np.float64:
        return {"kind": "dtype", "dtype": y.dtype.name}
    if np.array_equal(y, expected_sum(world_size, shape)):
        return {"kind": "ok"}
    flat = y.reshape(-1)
    start = 0
    for c, piece in enumerate(np.array_split(flat, world_size)):
        position, counts = decode(piece, world_size)
        if position != start or counts != (1,) * world_size:
            return {"kind": "wrong", "chunk": c, "position": position, "counts": counts, "start": start}
        start += piece.size
    return {"kind": "wrong", "chunk": None, "position": None, "counts": None, "start": 0}


def run_on_rank(comm, blob: bytes, shape, allowed) -> dict:
    """Run the learner's function (shipped as `blob`) on this rank through a `_Spy`; describe what happened."""
    fn = cloudpickle.loads(blob)[0]
    x = encoded_input(comm.rank, shape)
    spy = _Spy(comm, allowed)
    result = fn(spy, x)
    return {"sends": spy.sends, "modified": not np.array_equal(x, encoded_input(comm.rank, shape)),
            "result": _describe(result, shape, comm.world_size)}


def run_learner(cluster, fn, shape, allowed=("send", "recv", "sendrecv"), explain=None):
    """Run `fn(comm, x)` on every rank of `cluster`: (per-rank reports, None) or (None, a failure explaining the error).

    explain(trace, error) -> hint or None: what the traffic recorded before the error says went wrong.
    """
    blob = ship(fn, (), {})  # by value, as cluster.run ships notebook functions
    try:
        return cluster.run(run_on_rank, blob, tuple(shape), tuple(allowed)), None
    except Exception as e:  # noqa: BLE001 - the learner's code: report, don't crash
        return None, failed(explain_error(e, shape, explain(cluster.trace, e) if explain else None))


def explain_error(e: BaseException, shape, hint: str | None = None) -> str:
    """One sentence on an exception from the learner's ranks, plus `hint` (or a generic one)."""
    notes = " ".join(getattr(e, "__notes__", []))
    where = re.search(r"raised on rank (\d+)", notes)
    rank = f"rank {where[1]}" if where else "a rank"
    text = str(e).split("\n")[0]
    if isinstance(e, CollectiveTimeout):
        m = re.search(r"(rank \d+) waited past its deadline for (.+?) from (rank \d+)", text)
        waited = f"{m[1]} waited for {m[2]} from {m[3]}" if m else text
        return (f"with x of shape {tuple(shape)}, {waited}, and it never came. " + (hint or
                "Does every recv have a matching send with the same tag, from the rank it names?"))
    if isinstance(e, AttributeError) and "not available" in text:
        return f"on {rank}, your function asked for {text}"
    message = f"with x of shape {tuple(shape)}, your function raised {type(e).__name__} on {rank}: {text}"
    return message + (f" — {hint}" if hint else "")


def ranks_text(counts) -> str:
    """(1, 0, 2) -> 'ranks 0, 2, 2' (a rank appears as often as its data was added)."""
    ranks = [str(r) for r, k in enumerate(counts) for _ in range(k)]
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(ranks)


def _result_problem(rank: int, description: dict, world_size: int, shape) -> str | None:
    kind = description["kind"]
    if kind == "ok":
        return None
    if kind == "none":
        return f"rank {rank} returned None: return the reduced array (every rank returns the sum)."
    if kind == "type":
        return f"rank {rank} returned a {description['type']}: return a NumPy array."
    if kind == "shape":
        return (f"rank {rank} returned shape {description['shape']}, but x has shape {tuple(shape)}: "
                f"reshape the result to x.shape.")
    if kind == "dtype":
        return f"rank {rank} returned dtype {description['dtype']}, but x is float64: keep x's dtype."
    counts, chunk = description["counts"], description["chunk"]
    if counts is None or description["position"] != description["start"]:
        where = "" if chunk is None else f" in chunk {chunk}"
        return (f"rank {rank}'s result has numbers in the wrong place{where}: put each received piece back "
                f"where it came from, and join the pieces in order.")
    return None if counts == (1,) * world_size else (
        f"rank {rank}'s result{'' if chunk is None else f' (chunk {chunk})'} holds the data of "
        f"{ranks_text(counts)}, but should hold every rank's exactly once.")


def check_naive_allreduce(fn, world_sizes=(3, 4), shapes=((10,), (100_003,)), timeout: float = 15.0,
                          transport: str = "grpc") -> Feedback:
    """Exercise 02.1: `fn(comm, x)` = reduce to rank 0 + broadcast from it, with send/recv, on real gRPC ranks.

    transport="local" runs the same checks on thread ranks (the tests use it for quick wrong answers).
    """
    for n in world_sizes:
        with Cluster(n, transport, timeout=timeout) as cluster:
            for shape in shapes:
                reports, error = run_learner(cluster, fn, shape, ("send", "recv"), _naive_explain(n))
                if error is not None:
                    return error
                problem = _naive_problem(reports, cluster.trace, n, shape)
                if problem:
                    return failed(f"{n} ranks, x of shape {shape}: {problem}")
                root_bytes = sum(e.nbytes for e in cluster.trace.events if e.dst == 0)
    s = int(np.prod(shapes[-1])) * 8
    return passed(f"your naive all-reduce matches NumPy on {' and '.join(map(str, world_sizes))} gRPC ranks. "
                  f"With {n} ranks and S = {s} bytes the root received {n - 1} messages, "
                  f"{root_bytes} bytes = (N−1)·S, and sent as many; every other rank sent S once.")


def _naive_explain(n: int):
    def explain(trace, error) -> str | None:
        for e in trace.events:
            if e.src != 0 and e.dst != 0:
                return (f"rank {e.src} sent a message to rank {e.dst}: in the naive all-reduce every rank talks "
                        f"only to the root, rank 0.")
        if not isinstance(error, CollectiveTimeout):
            return None
        senders = {e.src for e in trace.events if e.dst == 0}
        silent = sorted(set(range(1, n)) - senders)
        if silent:
            return f"Rank(s) {silent} never sent their x to the root (with a tag the root receives)."
        if not any(e.src == 0 for e in trace.events):
            return ("The root never sent the sum back: after adding everything up, send the total to every "
                    "other rank (the broadcast half).")
        return None
    return explain


def _naive_problem(reports, trace, n: int, shape) -> str | None:
    """The first thing wrong with a naive all-reduce's traffic, results or inputs; None if nothing is."""
    for rank in range(1, n):
        for dst, *_ in reports[rank]["sends"]:
            if dst != 0:
                return (f"rank {rank} sent a message to rank {dst}: in the naive all-reduce every rank talks "
                        f"only to the root, rank 0.")
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
        return ("the root never sent the sum back, so the other ranks only have their own data: after adding "
                "everything up, send the total to every other rank (that is the broadcast half).")
    got = sorted(dst for dst, *_ in root)
    if got != list(range(1, n)):
        missing = sorted(set(range(1, n)) - set(got))
        if missing:
            return f"the root sent the sum to ranks {got} but not to {missing}: send it to every rank 1..N-1."
        return f"the root sent {len(root)} messages to ranks {got}: send the sum once to each other rank."
    for dst, _, _, position, counts in root:
        if counts is None or position != 0:
            return f"the root sent rank {dst} something that is not the sum of whole x's: send the total."
        if counts[0] == 0:
            return (f"the root sent rank {dst} a sum without its own x: start from the root's x "
                    f"(total = x.copy()), then add what arrives.")
        if counts != (1,) * n:
            return (f"the root sent rank {dst} the data of {ranks_text(counts)}: receive from every other rank, "
                    f"and add each x exactly once, before you send.")
    into_root = sum(1 for e in trace.events if e.dst == 0)
    if into_root != n - 1:
        return f"the root received {into_root} messages; with {n} ranks it receives N−1 = {n - 1}."
    for rank in range(n):
        problem = _result_problem(rank, reports[rank]["result"], n, shape)
        if problem:
            return problem
    for rank in range(n):
        if reports[rank]["modified"]:
            hint = (" `total = x` makes total another name for x, so += writes into x: start from x.copy()."
                    if rank == 0 else " Leave x as it is: send it, and return what the root sends back.")
            return f"rank {rank}'s input x changed during your all-reduce: the caller's data must stay as it was.{hint}"
    return None


def check_root_bytes(sent, received, world_size: int = 8, nbytes: int = 1 << 20) -> Feedback:
    """Exercise 02.2: bytes the naive root sends and receives in one all-reduce of S = 1 MiB on N = 8 ranks."""
    expected = (world_size - 1) * nbytes
    for name, value in (("sent", sent), ("received", received)):
        try:
            value = float(value)
        except (TypeError, ValueError):
            return failed(f"{name} must be a number of bytes.")
        if value == expected:
            continue
        if value == world_size - 1 or value == (world_size - 1) * 1.0:
            return failed(f"{name} = {value:g} looks like MiB (or a count of messages): answer in bytes, "
                          f"e.g. 3 * 1048576.")
        if value == world_size * nbytes:
            return failed(f"{name} = N·S: the root does not send to or receive from itself — count N−1 peers.")
        if value == nbytes:
            return failed(f"{name} = S: that is what each of the other ranks moves. The root talks to all N−1 of them.")
        if value == 2 * (world_size - 1) * nbytes:
            return failed(f"{name} = 2(N−1)·S: that is the root's traffic in both directions together; "
                          f"give each direction on its own.")
        return failed(f"{name} = {value:g} bytes is not it: how many other ranks does the root hear from "
                      f"(and answer), and how many bytes is each message?")
    return passed(f"the root receives and sends (N−1)·S = {world_size - 1} × {nbytes} = {expected} bytes each way "
                  f"({expected >> 20} MiB); every other rank moves S = {nbytes >> 20} MiB each way.")


def check_bottleneck_answer(choice: str) -> Feedback:
    """Exercise 02.3: why is the root the bottleneck of the naive all-reduce? (a, b or c)"""
    answers = {
        "a": "",
        "b": ("no: adding (N−1)·S bytes runs at memory speed (several GB/s) and is a small part of the time. "
              "Count what crosses the root's link instead."),
        "c": ("no: make any rank the root and it becomes the slow one. The imbalance is in the algorithm — "
              "the trace shows the root moving N−1 times the bytes of any other rank."),
    }
    success = ("every byte of every rank passes through the root's one link, (N−1)·S in and (N−1)·S out, "
               "while the other links carry S each way and sit idle most of the time. More ranks, "
               "longer queue at the root: the time grows with N.")
    return multiple_choice(choice, answers, right="a", success=success)
