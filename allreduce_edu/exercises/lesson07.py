"""Lesson 07 · fused reduce + LayerNorm + broadcast: write the fused variant, count root bytes.

`check_fused` runs your `my_fused(comm, x)` on real gRPC ranks with uneven rows, counts the rows
each rank normalises through `allreduce_edu.kernels` (the checker wraps its norm functions on every
rank while your function runs) and the bytes each rank sends, and compares the result with the
float64 reference.
"""

from __future__ import annotations

from .. import kernels
from ..collectives.ring import all_gather_ring, reduce_scatter_ring
from ..runtime import Cluster, ship
from .feedback import Feedback, failed, passed
from .fused_traffic import fused_explain, fused_on_rank, fused_problem
from .harness import explain_error, run_on_ranks
from .registry import exercise, hint, learner_or_reference, solution  # noqa: F401 - notebook
from .spec import Blank, Slip, choice, number
from .texts import message


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
    return passed(message(__name__, "07.1", "layernorm-sum-matches",
                          listed=' and '.join(map(str, world_sizes)),
                          where=where, listed2=', '.join(map(str, shapes)), n=n,
                          shape=shape, s=s, rows=rows, bytes=sum(sent.values())))


def root_sends(world_size: int, rank: int) -> tuple[int, int]:
    """(reduce, broadcast): the messages `rank` sends in the root variant, each the whole tensor
    (collectives/tree.py's binomial trees, rooted at rank 0)."""
    forwards = sum(rank < 1 << s and rank + (1 << s) < world_size
                   for s in range((world_size - 1).bit_length()))
    return int(rank != 0), forwards


number("07.2", module=__name__, blanks=(Blank("my_bytes", key="3 * (1 << 20)"),),
       inputs={"world_size": 12, "nbytes": 1 << 20, "rank": 2}, unit="bytes", exact=True,
       answer=lambda d: sum(root_sends(d.world_size, d.rank)) * d.nbytes,
       slips=lambda d: _root_slips(d.world_size, d.nbytes, d.rank),
       otherwise=lambda d, name, got: message(__name__, "07.2", "count-sends", rank=d.rank),
       success=lambda d: _root_success(d.world_size, d.nbytes, d.rank))


def _root_slips(n: int, s: int, rank: int) -> list:  # {rank}: the exercise's input
    reduce, forwards = root_sends(n, rank)
    sends = reduce + forwards
    return [
        Slip(2 * (n - 1) / n * s, "every-rank-sends"),
        Slip(2 * (n - 1) * s, "all-ranks-send"),
        Slip((n - 1).bit_length() * s, "rank-0-count"),
        Slip(forwards * s, "broadcast-only"),
        Slip(reduce * s, "reduce-only"),
        Slip(sends, "counts-messages"),
        Slip(sends * 1e6, "mib"),
        Slip(sends * s * 8, "bits"),
    ]


def _root_success(n: int, s: int, rank: int) -> str:
    reduce, forwards = root_sends(n, rank)
    return message(__name__, "07.2", "success", bytes=(reduce + forwards) * s,
                   sends=reduce + forwards, rank=rank, forwards=forwards, n=n,
                   root=(n - 1).bit_length() * s, per=2 * (n - 1) / n * s)


choice("07.3", module=__name__)
