"""Lesson 07's checkers: a right answer passes, typical wrong ones fail with a specific hint."""

from __future__ import annotations

import numpy as np
import pytest

from allreduce_edu import kernels
from allreduce_edu.collectives.ring import all_gather_ring, reduce_scatter_ring
from allreduce_edu.exercises._feedback import SOLUTIONS
from allreduce_edu.exercises.lesson07 import (
    check_fused,
    check_fusion_answer,
    check_root_bytes,
)

# wrong answers: the same checks on thread ranks, which start at once (the right answer runs on gRPC)
QUICK = {"world_sizes": (3,), "timeout": 5.0, "transport": "local"}


def fused(comm, x):
    pieces = np.array_split(x.copy(), comm.world_size, axis=0)
    reduce_scatter_ring(comm, pieces, "sum", last=lambda acc, incoming: kernels.add_layernorm(acc, incoming, out=acc))
    return np.concatenate(all_gather_ring(comm, pieces), axis=0)


def fused_imported_name(comm, x):  # add_layernorm imported by name, a new array instead of out=
    from allreduce_edu.kernels import add_layernorm

    pieces = np.array_split(x.copy(), comm.world_size, axis=0)
    reduce_scatter_ring(comm, pieces, last=lambda acc, incoming: add_layernorm(acc, incoming))
    return np.concatenate(all_gather_ring(comm, pieces), axis=0)


def unfused(comm, x):  # ring all-reduce of the sum, then every rank normalises every row
    pieces = np.array_split(x.copy(), comm.world_size, axis=0)
    reduce_scatter_ring(comm, pieces, "sum")
    return kernels.layernorm(np.concatenate(all_gather_ring(comm, pieces), axis=0))


def root(comm, x):  # everyone sends to rank 0, which normalises and sends the result back
    if comm.rank:
        comm.send(0, x, tag="reduce")
        return comm.recv(0, tag="broadcast")
    total = x.copy()
    for src in range(1, comm.world_size):
        total += comm.recv(src, tag="reduce")
    kernels.layernorm(total, out=total)
    for dst in range(1, comm.world_size):
        comm.send(dst, total, tag="broadcast")
    return total


def forgets_incoming(comm, x):
    pieces = np.array_split(x.copy(), comm.world_size, axis=0)
    reduce_scatter_ring(comm, pieces, "sum", last=lambda acc, incoming: kernels.layernorm(acc, out=acc))
    return np.concatenate(all_gather_ring(comm, pieces), axis=0)


def flat_split(comm, x):  # chunks of the flattened array cut rows in two
    pieces = np.array_split(x.reshape(-1).copy(), comm.world_size)
    reduce_scatter_ring(comm, pieces, "sum", last=lambda acc, incoming: kernels.add_layernorm(acc, incoming, out=acc))
    return np.concatenate(all_gather_ring(comm, pieces)).reshape(x.shape)


def no_copy(comm, x):
    pieces = np.array_split(x, comm.world_size, axis=0)
    reduce_scatter_ring(comm, pieces, "sum", last=lambda acc, incoming: kernels.add_layernorm(acc, incoming, out=acc))
    return np.concatenate(all_gather_ring(comm, pieces), axis=0)


def no_all_gather(comm, x):
    pieces = np.array_split(x.copy(), comm.world_size, axis=0)
    return reduce_scatter_ring(comm, pieces, "sum",
                               last=lambda acc, incoming: kernels.add_layernorm(acc, incoming, out=acc))


def never_normalises(comm, x):
    pieces = np.array_split(x.copy(), comm.world_size, axis=0)
    reduce_scatter_ring(comm, pieces, "sum")
    return np.concatenate(all_gather_ring(comm, pieces), axis=0)


def normalises_in_numpy(comm, x):  # right values, but the norm is a separate NumPy pass the checker cannot see
    from allreduce_edu.reference import layernorm_reference

    pieces = np.array_split(x.copy(), comm.world_size, axis=0)
    reduce_scatter_ring(comm, pieces, "sum", last=lambda acc, incoming: layernorm_reference(acc + incoming)
                        .astype(acc.dtype))
    return np.concatenate(all_gather_ring(comm, pieces), axis=0)


def sends_twice(comm, x):  # right result, but every rank sends its whole x to the right first
    comm.sendrecv((comm.rank + 1) % comm.world_size, x, (comm.rank - 1) % comm.world_size, tag="extra")
    return fused(comm, x)


def test_right_answer_passes_on_grpc_and_reports_rows_and_bytes():
    feedback = check_fused(fused)
    assert feedback, feedback
    assert "normalised [4, 3, 3, 3] rows" in feedback.message and "7488 bytes" in feedback.message


def test_add_layernorm_imported_by_name_is_counted_too():
    assert check_fused(fused_imported_name, world_sizes=(3, 4), transport="local")


@pytest.mark.parametrize("fn, words", [
    (unfused, ["unfused variant", "all rows on every rank"]),
    (root, ["root variant", "only rank 0"]),
    (forgets_incoming, ["x alone", "add_layernorm(acc, incoming)"]),
    (flat_split, ["not a whole number of rows", "axis=0"]),
    (no_copy, ["input x changed", "x.copy()"]),
    (no_all_gather, ["only its own", "all-gather"]),
    (never_normalises, ["not normalised", "last="]),
    (normalises_in_numpy, ["no rows normalised", "kernels.add_layernorm"]),
    (sends_twice, ["sent", "2(N−1)/N·S"]),
])
def test_wrong_answers_get_specific_hints(fn, words):
    feedback = check_fused(fn, **QUICK)
    assert not feedback
    for word in words:
        assert word in feedback.message, feedback


def test_kernels_are_restored_after_a_check():
    originals = kernels.layernorm, kernels.add_layernorm, kernels.rmsnorm, kernels.sum_layernorm
    check_fused(unfused, **QUICK)
    assert (kernels.layernorm, kernels.add_layernorm, kernels.rmsnorm, kernels.sum_layernorm) == originals


@pytest.mark.parametrize("answer, hint", [(1.75 * 2**20, "ring"), (7 * 2**20, "naive broadcast"),
                                          (14 * 2**20, "all ranks send together"), (6 * 2**20, "only receives"),
                                          (2**20, "every broadcast step"), (3, "multiply by S"),
                                          (3e6, "not 10^6"), (24 * 2**20, "not bits"), (5, "not it")])
def test_root_bytes(answer, hint):
    assert check_root_bytes(3 * 2**20)
    feedback = check_root_bytes(answer)
    assert not feedback and hint in feedback.message, feedback


def test_fusion_answer():
    assert check_fusion_answer("b")
    assert "same bytes" in check_fusion_answer("a").message
    assert "dtype" in check_fusion_answer("c").message
    assert "GPU" in check_fusion_answer("d").message
    assert "'a', 'b', 'c' or 'd'" in check_fusion_answer("e").message


def test_solutions_are_registered_and_the_fused_solution_runs():
    for key in ("07.1", "07.2", "07.3"):
        assert key in SOLUTIONS
    namespace = {"np": np}
    exec(SOLUTIONS["07.1"].split("(A world")[0], namespace)  # noqa: S102 - our own solution text
    assert check_fused(namespace["my_fused"], world_sizes=(4,), transport="local")
