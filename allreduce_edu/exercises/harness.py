"""The checkers' shared machinery: inputs that say where every number came from, a spying comm,
verdicts.

Element i of rank r's input is i·2^27 + 8^r, so any sum of pieces of inputs tells which ranks it
contains (the base-8 digits below 2^27) and which positions (the part above). A `Spy` communicator
hands the learner's messages on and writes down what each one carried, so a checker can replay the
traffic step by step. Lessons 02, 03, 07 and 09 build on these. `run_on_ranks` is the one runner
of a learner's code on ranks: every checker calls it, and a failure comes back as a `RankError`
that names its rank.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from types import SimpleNamespace

import cloudpickle
import numpy as np

from ..comm.contract import Comm
from ..comm.errors import CollectiveTimeout
from ..runtime import run_on_engine, ship
from .feedback import failed

# element i carries i·POSITION (times the number of ranks added into it) ...
POSITION = float(1 << 27)
# ... plus 8^r for each rank r it contains: base-8 digits count every rank's contributions
DIGIT = 8


def encoded_input(rank: int, shape) -> np.ndarray:
    """The checkers' input on `rank`: element i is i·2^27 + 8^rank (float64; sums stay exact up to
    ~10^6 elements)."""
    count = int(np.prod(shape, dtype=np.int64))
    return (np.arange(count, dtype=np.float64) * POSITION + float(DIGIT ** rank)).reshape(shape)


def expected_sum(world_size: int, shape) -> np.ndarray:
    """What a sum all-reduce of `encoded_input` over `world_size` ranks gives."""
    return sum(encoded_input(r, shape) for r in range(world_size))


def decode(array, world_size: int) -> tuple[int | None, tuple[int, ...] | None]:
    """(position of the first element, how many times each rank's data is in it) for a piece of
    encoded data.

    (None, None) when the piece is not float64, is empty, or its elements disagree (pieces of
    different positions were added together, or elements are out of order).
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


class Spy(Comm):
    """The comm your function gets: rank, world_size, send, recv, sendrecv (and isend, barrier,
    collective where allowed), forwarded to the real Communicator; every send is written down as
    (dst, nbytes, dtype, first position, ranks' counts). It keeps the whole contract
    (comm.contract), refusing at the call what the exercise does not allow."""

    def __init__(self, comm, allowed=("send", "recv", "sendrecv")):
        self._comm, self._allowed = comm, tuple(allowed)
        self.rank, self.world_size = comm.rank, comm.world_size
        self.ranks_per_node, self.links = comm.ranks_per_node, comm.links
        self.sends: list[tuple] = []

    def _note(self, dst, array) -> None:
        a = np.asarray(array)
        self.sends.append((dst, a.nbytes, a.dtype.name, *decode(a, self.world_size)))

    def _check(self, name: str) -> None:
        if name not in self._allowed:
            raise AttributeError(self._refusal(name))

    def _refusal(self, name: str) -> str:
        return (f"comm.{name}, which is not available in this exercise: use only "
                "comm.rank, comm.world_size, "
                + ", ".join(f"comm.{a}" for a in self._allowed)
                + ". (Calling one of the library's collectives? Write the algorithm yourself, from "
                  "messages.)")

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

    def barrier(self):
        self._check("barrier")
        return self._comm.barrier()

    def send_buffer(self, dst, shape, dtype):
        """Always allowed: an array to fill, nothing sent."""
        return self._comm.send_buffer(dst, shape, dtype)

    def collective(self, *args, **kwargs):
        """Where allowed: the library's collectives open one, and the learner writes their own."""
        self._check("collective")
        return self._comm.collective(*args, **kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(self._refusal(name))


def describe_result(result, shape, world_size: int) -> dict:
    """What a rank returned, for the checker: ok, or the first thing wrong with it (computed on the
    rank)."""
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
            return {"kind": "wrong", "chunk": c, "position": position, "counts": counts,
                    "start": start}
        start += piece.size
    return {"kind": "wrong", "chunk": None, "position": None, "counts": None, "start": 0}


def run_on_rank(comm, blob: bytes, shape, allowed) -> dict:
    """Run the learner's function (shipped as `blob`) on this rank through a `Spy`; describe what
    happened."""
    fn = cloudpickle.loads(blob)[0]
    x = encoded_input(comm.rank, shape)
    spy = Spy(comm, allowed)
    result = fn(spy, x)
    return {"sends": spy.sends, "modified": not np.array_equal(x, encoded_input(comm.rank, shape)),
            "result": describe_result(result, shape, comm.world_size)}


def run_learner(cluster, fn, shape, allowed=("send", "recv", "sendrecv"), explain=None):
    """Run `fn(comm, x)` on every rank of `cluster`: (per-rank reports, None) or (None, a failure
    explaining the error).

    explain(trace, error) -> hint or None: what the traffic recorded before the error says went
    wrong.
    """
    blob = ship(fn, (), {})  # by value, as cluster.run ships notebook functions
    reports, failure = run_on_ranks(cluster, run_on_rank, blob, tuple(shape), tuple(allowed))
    if failure is None:
        return reports, None
    hint = explain(cluster.trace, failure.error) if explain else None
    return None, failed(explain_error(failure, shape, hint))


def failed_rank(e: BaseException) -> int | None:
    """The rank an exception from cluster.run or run_on_engine was raised on (None: unknown)."""
    rank = getattr(e, "failed_rank", None)
    return rank if isinstance(rank, int) else None


def explain_error(e, shape, hint: str | None = None) -> str:
    """One sentence on what the learner's ranks raised (a RankError, or the exception itself),
    plus `hint` (or a generic one)."""
    failure = e if isinstance(e, RankError) else RankError(e, failed_rank(e))
    e, rank = failure.error, failure.on
    text = str(e).split("\n")[0].strip()
    if isinstance(e, CollectiveTimeout):  # the ranks from the attributes; the tag, for the reader
        tag = re.search(r"deadline for ('[^']*'|\S+) from", text)
        waited = (f"{rank} waited for {tag[1] if tag else 'a message'} from rank {e.ranks[0]}"
                  if e.ranks and failure.rank is not None else text)
        return (f"with x of shape {tuple(shape)}, {waited}, and it never came. " + (hint or
                "Does every recv have a matching send with the same tag, from the rank it names?"))
    if isinstance(e, AttributeError) and "not available" in text:
        return f"on {rank}, your function asked for {text}"
    message = (f"with x of shape {tuple(shape)}, your function raised {type(e).__name__} on "
               f"{rank}: {text}")
    return message + (f" — {hint}" if hint else "")


def ranks_text(counts) -> str:
    """(1, 0, 2) -> 'ranks 0, 2, 2' (a rank appears as often as its data was added)."""
    ranks = [str(r) for r, k in enumerate(counts) for _ in range(k)]
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(ranks)


def result_problem(rank: int, description: dict, world_size: int, shape) -> str | None:
    kind = description["kind"]
    if kind == "ok":
        return None
    if kind == "none":
        return f"rank {rank} returned None: return the reduced array (every rank returns the sum)."
    if kind == "type":
        return f"rank {rank} returned a {description['type']}: return a NumPy array."
    if kind == "shape":
        return (f"rank {rank} returned shape {description['shape']}, but x has shape "
                f"{tuple(shape)}: reshape the result to x.shape.")
    if kind == "dtype":
        return (f"rank {rank} returned dtype {description['dtype']}, but x is float64: "
                f"keep x's dtype.")
    counts, chunk = description["counts"], description["chunk"]
    if counts is None or description["position"] != description["start"]:
        where = "" if chunk is None else f" in chunk {chunk}"
        return (f"rank {rank}'s result has numbers in the wrong place{where}: put each received "
                f"piece back where it came from, and join the pieces in order.")
    return None if counts == (1,) * world_size else (
        f"rank {rank}'s result{'' if chunk is None else f' (chunk {chunk})'} holds the data of "
        f"{ranks_text(counts)}, but should hold every rank's exactly once.")


# --- the one runner of a learner's code on ranks ----------------------------------------------
@dataclass(frozen=True)
class RankError:
    """What the learner's code raised, and on which rank (None: unknown), from an attribute."""

    error: BaseException
    rank: int | None

    @property
    def on(self) -> str:
        return "a rank" if self.rank is None else f"rank {self.rank}"


def engine_ranks(engine: str, world_size: int, timeout: float, comm_timeout: float):
    """`world_size` new `engine` processes (MPI, gloo) for run_on_ranks, started for each run."""
    return SimpleNamespace(run=lambda fn, *args: run_on_engine(
        fn, engine, world_size, *args, timeout=timeout, comm_timeout=comm_timeout))


def run_on_ranks(ranks, fn, *args, **kwargs) -> tuple[list | None, RankError | None]:
    """The one runner of a learner's code: fn(comm, ...) on every rank of `ranks` (a Cluster or
    engine_ranks); (results by rank, None) or (None, the RankError)."""
    try:
        return ranks.run(fn, *args, **kwargs), None
    except Exception as e:  # noqa: BLE001 - the learner's code: report, don't crash
        return None, RankError(e, failed_rank(e))


def with_own_input(comm, fn, inputs):
    """On each rank: the learner's fn(comm, x) on a copy of this rank's input."""
    return fn(comm, inputs[comm.rank].copy())


def time_allreduce(cluster, fn, nbytes: int = 4 << 20, reps: int = 5) -> float:
    """Median seconds of `fn(comm, x)` over `reps` runs on every rank of `cluster` (x: `nbytes` of
    float32).

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
