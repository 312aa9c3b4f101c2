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
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - notebook
from .ring_traffic import pipelined_problem, ring_explain, ring_problem
from .spec import MIB, Blank, Slip, choice, number
from .texts import message


@exercise("03.1", kind="code",
    function="my_ring_allreduce",
    library=("collectives.ring:allreduce_ring_plain", "collectives.ring:allreduce_ring",
             "collectives.ring:reduce_scatter_ring", "collectives.ring:all_gather_ring"),
    imports="")
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
    return passed(message(__name__, "03.1", "ring-matches-numpy",
                          listed=' and '.join(map(str, world_sizes)),
                          listed2=', '.join(map(str, shapes)), n=n, s=s,
                          bytes=sent[n, shape][0], chunks=2 * (n - 1) * s / n))


number("03.2", module=__name__,
       blanks=(Blank("my_bytes", key="(30 * 62500 + 4) * 8"),),
       inputs={"world_size": 16, "count": 1_000_003},
       unit="bytes",
       exact=True,
       answer=lambda d: ring_bytes_sent(d.count, d.world_size),
       slips=lambda d: [
           Slip(2 * (d.world_size - 1) / d.world_size * d.count * 8, "equal-chunks"),
           Slip(2 * (d.world_size - 1) * (d.count // d.world_size) * 8, "all-short"),
           Slip(2 * (d.world_size - 1) * (d.count // d.world_size + 1) * 8, "all-long"),
           Slip(ring_bytes_sent(d.count, d.world_size) / MIB, "mib"),
           Slip(2 * d.count * 8, "limit"),
           Slip((d.world_size - 1) * d.count * 8, "naive-root"),
           Slip(2 * (d.world_size - 1), "messages"),
       ],
       values=lambda d: {"sent": ring_bytes_sent(d.count, d.world_size),
                         "bound": 2 * (d.world_size - 1) / d.world_size * d.count * 8})


def ring_bytes_sent(count: int, world_size: int, rank: int = 0, itemsize: int = 8) -> int:
    """Bytes `rank` sends in a ring all-reduce of `count` elements cut by np.array_split."""
    n = world_size
    q, extra = divmod(count, n)
    size = lambda chunk: (q + (chunk % n < extra)) * itemsize  # noqa: E731 - np.array_split's
    return sum(size(rank - s - 1) + size(rank - s) for s in range(n - 1))


@exercise("03.3", kind="code",
    function="my_pipelined_ring",
    library=(),
    imports="")
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
    return passed(message(__name__, "03.3", "still-correct-ring", messages=2 * (n - 1) * segments,
                          segments=segments))


choice("03.4", module=__name__)


number("03.0", module=__name__,
       blanks=(Blank("my_holder", key="1"),),
       inputs={"world_size": 4, "chunk": 2, "steps": 2},
       exact=True,
       answer=lambda d: _path(d)[d.steps],
       slips=lambda d: [Slip(rank, _owner_slip(d, rank)) for rank in range(d.world_size)
                        if rank != _path(d)[d.steps]],
       otherwise=lambda d, name, got: f"there are {d.world_size} ranks, numbered 0 to "
                                      f"{d.world_size - 1}.",
       success=lambda d: _owner_success(d))


def _path(d) -> list[int]:
    """path[h]: the rank that holds chunk d.chunk after h steps of reduce-scatter."""
    return [(d.chunk + 1 + hop) % d.world_size for hop in range(d.world_size)]


def _owner_success(d) -> str:
    path, n, steps, chunk = _path(d), d.world_size, d.steps, d.chunk
    rest = (message(__name__, "03.0", "goes-on-rank", chunk=chunk) if steps < n - 1 else
            message(__name__, "03.0", "after-reduce-scatter"))
    return (message(__name__, "03.0", "rank-path-chunk", path=path[steps], chunk=chunk,
                    path2=path[0], listed=' → '.join(map(str, path[:steps + 1])),
                    count=_count(steps, 'step'), ranks=steps + 1, rest=rest))


def _owner_slip(d, rank: int) -> str:
    path, n, steps, chunk = _path(d), d.world_size, d.steps, d.chunk
    hop = path.index(rank)
    if hop == 0:
        return (message(__name__, "03.0", "start", rank=rank, chunk=chunk, n=n,
                        count=_count(steps, 'step')))
    if hop < steps:
        return (message(__name__, "03.0", "early", rank=rank, chunk=chunk,
                        count=_count(hop, 'step'), ranks=hop + 1,
                        count2=_count(steps - hop, 'more hop')))
    if hop == n - 1:
        return (message(__name__, "03.0", "end", rank=rank, chunk=chunk, steps=n - 1,
                        count=_count(steps, 'step'),
                        count2=_count(n - 1 - steps, 'hop')))
    return (message(__name__, "03.0", "chunk-chunk-reaches", chunk=chunk, rank=rank,
                    count=_count(hop, 'step'), path=path[0]))


def _count(k: int, thing: str) -> str:
    return f"{k} {thing}{'' if k == 1 else 's'}"
