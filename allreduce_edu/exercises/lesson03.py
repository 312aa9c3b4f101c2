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


@exercise("03.1", kind="code",
    function="my_ring_allreduce",
    library=("collectives.ring:allreduce_ring", "collectives.ring:reduce_scatter_ring",
             "collectives.ring:all_gather_ring"),
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
    return passed(f"your ring matches NumPy on {' and '.join(map(str, world_sizes))} gRPC ranks, "
                  f"for x of shapes {', '.join(map(str, shapes))}; every rank sent 2(N−1) chunks, "
                  f"only to its right neighbour. With {n} ranks and S = {s} bytes, rank 0 sent "
                  f"{sent[n, shape][0]} bytes; 2(N−1)/N·S = {2 * (n - 1) * s / n:.0f} (chunks "
                  f"differ by at most one element).")


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
    return passed(f"still a correct ring: every rank sent {2 * (n - 1) * segments} messages of "
                  f"about S/({segments}N) bytes — {segments}× the messages, the same 2(N−1)/N·S "
                  f"bytes.")


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
    rest = (f" It goes on to rank {chunk}, which adds the last part: after reduce-scatter rank r "
            f"owns finished chunk r." if steps < n - 1 else
            " After reduce-scatter rank r owns finished chunk r.")
    return (f"rank {path[steps]}: chunk {chunk} starts on rank {path[0]} and travels "
            f"{' → '.join(map(str, path[:steps + 1]))}, picking up one rank's data per hop: after "
            f"{_count(steps, 'step')} it holds the data of {steps + 1} ranks.{rest}")


def _owner_slip(d, rank: int) -> str:
    path, n, steps, chunk = _path(d), d.world_size, d.steps, d.chunk
    hop = path.index(rank)
    if hop == 0:
        return (f"rank {rank} is where chunk {chunk} starts (in the first step rank r sends chunk "
                f"(r − 1) % N, and ({rank} − 1) % {n} = {chunk}). Follow it one hop to the right "
                f"per step, for {_count(steps, 'step')}.")
    if hop < steps:
        return (f"rank {rank} holds chunk {chunk} after {_count(hop, 'step')}, with the data of "
                f"{hop + 1} ranks; follow it {_count(steps - hop, 'more hop')} to the right.")
    if hop == n - 1:
        return (f"rank {rank} owns chunk {chunk} at the end of reduce-scatter, after all N − 1 = "
                f"{n - 1} steps; after {_count(steps, 'step')} the chunk is still "
                f"{_count(n - 1 - steps, 'hop')} short of it.")
    return (f"chunk {chunk} reaches rank {rank} only after {_count(hop, 'step')}: count the hops "
            f"again, one per step from rank {path[0]}.")


def _count(k: int, thing: str) -> str:
    return f"{k} {thing}{'' if k == 1 else 's'}"
