"""Lesson 07 · fused reduce + LayerNorm + broadcast: write the fused variant, count root bytes.

`check_fused` runs your `my_fused(comm, x)` on real gRPC ranks with uneven rows, counts the rows
each rank normalises through `allreduce_edu.kernels` (the checker wraps its norm functions on every
rank while your function runs) and the bytes each rank sends, and compares the result with the
float64 reference.
"""

from __future__ import annotations

import math

from .. import kernels
from ..collectives.ring import all_gather_ring, reduce_scatter_ring
from ..runtime import Cluster, ship
from .feedback import Feedback, failed, passed
from .fused_traffic import fused_explain, fused_on_rank, fused_problem
from .harness import explain_error, run_on_ranks
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - notebook
from .spec import Blank, Slip, choice, number


@exercise("07.1", kind="code", function="my_fused", library=("collectives.fused:_fused",),
          needs={"kernels": kernels, "reduce_scatter_ring": reduce_scatter_ring,
           "all_gather_ring": all_gather_ring})
def check_fused(fn, world_sizes=(3, 4), shapes=((10, 16), (2, 8), (13, 24)), timeout: float = 20.0,
                transport: str = "grpc") -> Feedback:
    """Exercise 07.1: `fn(comm, x)` = LayerNorm(sum over ranks of x) on every rank, fused into a
    ring all-reduce.

    Runs on real gRPC ranks of each world size with uneven rows (and fewer rows than ranks), then
    checks the result against the float64 reference, the rows each rank normalised, and the bytes
    each rank sent.
    """
    blob = ship(fn, (), {})
    summary = {}
    for n in world_sizes:
        with Cluster(n, transport, timeout=timeout) as cluster:
            for shape in shapes:
                reports, failure = run_on_ranks(cluster, fused_on_rank, blob, tuple(shape))
                if failure:
                    hint = fused_explain(failure.error)
                    return failed(f"{n} ranks: " + explain_error(failure, shape, hint))
                sent = cluster.trace.bytes_sent()
                problem = fused_problem(reports, n, tuple(shape), sent)
                if problem:
                    return failed(f"{n} ranks, x of shape {tuple(shape)}: {problem}")
                summary[n, tuple(shape)] = (sent, [rep["rows"] for rep in reports])
    n, shape = max(world_sizes), max(shapes, key=lambda s: s[0] * s[1])
    sent, rows = summary[n, tuple(shape)]
    s = shape[0] * shape[1] * 4
    where = "gRPC" if transport == "grpc" else transport
    return passed(f"LayerNorm of the sum matches the float64 reference on "
                  f"{' and '.join(map(str, world_sizes))} {where} ranks, for x of shapes "
                  f"{', '.join(map(str, shapes))}. With {n} ranks and x of shape {shape} (S = {s} "
                  f"bytes) your ranks normalised {rows} rows and sent {sum(sent.values())} bytes "
                  f"in all = 2(N−1)·S, as a ring all-reduce does.")


number("07.2", module=__name__, blanks=(Blank("my_bytes", key="4 * (1 << 20)"),),
       inputs={"world_size": 12, "nbytes": 1 << 20}, unit="bytes", exact=True,
       answer=lambda d: (d.world_size - 1).bit_length() * d.nbytes,
       slips=lambda d: _root_slips(d.world_size, d.nbytes),
       otherwise=lambda d, name, got: (
        f"the broadcast from rank 0 takes ⌈log2 N⌉ = {(d.world_size - 1).bit_length()} steps, "
        f"and in the reduce rank 0 only receives. How many bytes does rank 0 send per step?"),
       success=lambda d: _root_success(d.world_size, d.nbytes))


def _root_slips(n: int, s: int) -> list:
    steps, below = (n - 1).bit_length(), n.bit_length() - 1
    slips = [
        Slip(2 * (n - 1) / n * s, "that is what every rank sends in the ring (fused or unfused); "
                                  "the root variant uses binomial trees."),
        Slip((n - 1) * s, "that is a naive broadcast (rank 0 sends to each of the N − 1 others); "
                          "the binomial tree lets ranks that already hold the data pass it on, "
                          "so rank 0 sends once per step."),
        Slip(2 * (n - 1) * s, "that is what all ranks send together (2(N−1)·S); the question "
                              "asks for rank 0 alone."),
        Slip(2 * steps * s, "rank 0 is the root of the reduce: there it only receives. Count its "
                            "broadcast sends only."),
        Slip(s, "rank 0 sends in every broadcast step, not just once: the ranks that hold the "
                "data double each step."),
        Slip(steps, "that is the number of broadcast steps; each sends the whole tensor, S "
                    "bytes: multiply by S."),
        Slip(steps * 1e6, "S = 1 MiB = 1048576 bytes, not 10^6."),
        Slip(steps * s * 8, "in bytes, not bits."),
    ]
    if below != steps:
        slips += [Slip(below * s, f"after {below} steps {1 << below} ranks hold the tensor and "
                                  f"{n - (1 << below)} still wait: one more step, ⌈log2 N⌉ = "
                                  f"{steps} in all."),
                  Slip(math.log2(n) * s, f"log2 {n} is not a whole number of steps: a step "
                                         f"either happens or not, so round up to ⌈log2 N⌉ = "
                                         f"{steps}.")]
    return slips


def _root_success(n: int, s: int) -> str:
    steps = (n - 1).bit_length()
    return (f"{steps * s} bytes = ⌈log2 {n}⌉ · S = {steps} × {s}: rank 0 only receives in the "
            f"reduce, then sends the whole tensor once per broadcast step. A ring sends "
            f"2(N−1)/N·S = {2 * (n - 1) / n * s:.0f} per rank — less, but in {2 * (n - 1)} steps "
            f"instead of {2 * steps}.")


choice("07.3", module=__name__)
