"""Running a learner's ring on engine processes: each rank against the engine's own all-reduce."""

from __future__ import annotations

import contextlib
import re

import cloudpickle
import numpy as np

from ..comm.errors import CollectiveAborted
from .harness import RankError, Spy, describe_result, encoded_input, result_problem


class RingFailed(Exception):
    """Your ring raised on a rank: (size, exception type, first line of its message, comm methods
    it used, the comm call it raised in or "")."""


class _Watch(Spy):
    """The comm your ring gets: send, recv, sendrecv, isend (noting which ones you use, and the one
    a rank was in when it failed), nothing else. `synchronous`: send and isend are comm.ssend and
    comm.issend, which return only once the receiver has taken the message, as gloo's send does."""

    def __init__(self, comm, synchronous: bool = False):
        super().__init__(comm, ("send", "recv", "sendrecv", "isend"))
        self.used: set[str] = set()
        self._real, self.synchronous = comm, synchronous
        self.failed_in = ""  # the comm call an exception came out of ("send": a send never taken)

    def _check(self, name: str) -> None:
        super()._check(name)
        self.used.add(name)

    def _note(self, dst, array) -> None:
        pass  # nothing to replay here: the engine's all-reduce is the oracle

    @contextlib.contextmanager
    def _in(self, name: str):
        try:
            yield
        except Exception:
            self.failed_in = self.failed_in or name
            raise

    def send(self, dst, array, tag, **kwargs):
        with self._in("send"):
            if not self.synchronous:
                return super().send(dst, array, tag, **kwargs)
            self._check("send")
            return self._real.ssend(dst, array, tag, **kwargs)

    def isend(self, dst, array, tag, **kwargs):
        with self._in("isend"):
            if not self.synchronous:
                return super().isend(dst, array, tag, **kwargs)
            self._check("isend")
            return self._real.issend(dst, array, tag, **kwargs)

    def recv(self, src, tag, **kwargs):
        with self._in("recv"):
            return super().recv(src, tag, **kwargs)

    def sendrecv(self, dst, array, src, tag, **kwargs):
        with self._in("sendrecv"):
            return super().sendrecv(dst, array, src, tag, **kwargs)


def ring_on_rank(comm, blob: bytes, sizes, synchronous: bool = False) -> list[dict]:
    """On each rank: your ring on encoded inputs of each size, its result against the engine's own
    all-reduce (`synchronous`: sends wait for the receiver, as on gloo)."""
    fn, n, rows = cloudpickle.loads(blob)[0], comm.world_size, []
    watch = _Watch(comm, synchronous)
    for size in sizes:
        x = encoded_input(comm.rank, (size,))
        try:
            y = fn(watch, x)
        except CollectiveAborted:
            raise  # stopped because another rank failed: that rank's error is the verdict
        except Exception as e:
            first_line = str(e).split("\n")[0]
            raise RingFailed(size, type(e).__name__, first_line, sorted(watch.used),
                             watch.failed_in) from e
        builtin = comm.builtin_allreduce  # None on gRPC ranks: NumPy's sum is the oracle
        oracle = builtin(encoded_input(comm.rank, (size,))) if builtin else None
        agrees = np.array_equal(np.asarray(y), oracle) if builtin else None
        rows.append({"size": size, "result": describe_result(y, (size,), n), "agrees": agrees,
                     "modified": not np.array_equal(x, encoded_input(comm.rank, (size,))),
                     "used": sorted(watch.used)})
    return rows


def with_prefix(prefix: str, message: str) -> str:
    """`prefix` + `message`, the message capitalised when a prefix starts the sentence."""
    return prefix + (message[:1].upper() + message[1:] if prefix else message)


def explain_failure(failure: RankError, engine: str, ranks: str) -> str:
    """One sentence on how your ring failed (a RingFailed on a rank), with a hint.

    Each rank's own error says enough: a rank whose send raised was waiting for a receiver that
    never came, whether its deadline passed first (CollectiveTimeout) or a peer's did and the
    engine then lost that peer (gloo: "Connection closed by peer"). Sends wait for the receiver on
    every engine and transport this is called for (gloo; MPI above its eager limit; ssend)."""
    size, kind, text, used, failed_in = failure.error.args
    n = int(ranks.split()[0])
    rank = failure.rank
    where = f"with {ranks} and x of {size:,} elements, rank {'?' if rank is None else rank}"
    if failed_in == "send" or "(a synchronous send)" in text:  # or an issend's request.wait()
        source_line = re.compile(r"\[[^]]*:[0-9]+\] ")  # gloo's "[.../pair.cc:553] "
        why = text.split("; ")[0] if kind == "CollectiveTimeout" else (
            f"its send ended when a peer, waiting as long, gave up: "
            f"{source_line.sub('', text).split('. ')[0][:160]}")
        on = f"On {engine}," if engine in ranks else "On these ranks, as on gloo,"
        return (f"{where} waited forever in comm.send ({why}). {on} comm.send returns only once "
                f"the receiver has taken the message (gloo always; MPI above its eager limit of "
                f"a few KiB). When every rank sends before it receives, all of them wait. Use "
                f"comm.sendrecv(right, chunk, left, tag), which sends and receives at once.")
    if kind == "CollectiveTimeout":
        return (f"{where} waited forever: {text}. Every recv needs a matching send with the same "
                f"tag from the rank it names: a ring sends to (rank + 1) % N and receives from "
                f"(rank − 1) % N.")
    if "cannot reshape" in text:
        return (f"{where} raised {kind}: {text}. x.reshape(N, -1) needs the size to divide by N, "
                f"and {size:,} elements do not divide by {n}. Cut x with "
                f"np.array_split(x.reshape(-1).copy(), N): N chunks that differ by at most one "
                f"element.")
    if "broadcast" in text:
        return (f"{where} raised {kind}: {text}. The chunk you received and the one you add it to "
                f"differ in length: with uneven chunks, add into the chunk with the same index, "
                f"(rank − step − 2) % N.")
    if kind == "AttributeError" and "not available" in text:
        return f"{where} asked for {text}"
    if "index" in text and "out of" in text:
        return (f"{where} raised {kind}: {text}. A chunk index must stay between 0 and N − 1: "
                f"take it % N, as in (rank − step − 1) % N.")
    return (f"{where} raised {kind}: {text}. Run it yourself to see the traceback: "
            f"Cluster(3, transport=\"local\").run(fixed_ring, np.arange(10.0)).")


def first_problem(per_rank, ranks: str, sizes, oracle: str) -> str | None:
    """The first wrong result or changed input, rank by rank, size by size; None if all is right."""
    n = len(per_rank)
    for j, size in enumerate(sizes):
        where = f"with {ranks} and x of {size:,} elements, "
        for r in range(n):
            row = per_rank[r][j]
            if row["result"]["kind"] != "ok" or row["agrees"] is False:
                problem = result_problem(r, row["result"], n, (size,))
                return where + (problem or f"rank {r}'s result differs from {oracle}'s.")
        for r in range(n):
            if per_rank[r][j]["modified"]:
                return where + (f"rank {r}'s input x changed during your all-reduce: reshape and "
                                f"np.array_split return views of x, so += on a chunk writes into "
                                f"x. Split a copy: np.array_split(x.reshape(-1).copy(), N).")
    return None
