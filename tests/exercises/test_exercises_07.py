"""Lesson 07's checkers: a right answer passes, typical wrong ones fail with a specific hint."""

from __future__ import annotations

import numpy as np
import pytest

from allreduce_edu import Cluster
from allreduce_edu.collectives.fused import reduce_layernorm_broadcast
from allreduce_edu.collectives.ring import all_gather_ring, reduce_scatter_ring
from allreduce_edu.exercises import reference, registry
from allreduce_edu.exercises.lesson07 import (
    check_fused,
    check_fusion_answer,
    check_root_bytes,
    root_sends,
)
from allreduce_edu.kernels import cpu as kernels

# wrong answers: the same checks on thread ranks, which start at once (the right answer runs on gRPC)
QUICK = {"world_sizes": (3,), "timeout": 5.0, "transport": "local"}


def fused(comm, x):
    pieces = np.array_split(x.copy(), comm.world_size, axis=0)
    reduce_scatter_ring(comm, pieces, "sum", last=lambda acc, incoming: kernels.add_layernorm(acc, incoming, out=acc))
    return np.concatenate(all_gather_ring(comm, pieces), axis=0)


def fused_imported_name(comm, x):  # add_layernorm imported by name, a new array instead of out=
    from allreduce_edu.kernels.cpu import add_layernorm

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
    from allreduce_edu.kernels.reference import layernorm_reference

    pieces = np.array_split(x.copy(), comm.world_size, axis=0)
    reduce_scatter_ring(comm, pieces, "sum", last=lambda acc, incoming: layernorm_reference(acc + incoming)
                        .astype(acc.dtype))
    return np.concatenate(all_gather_ring(comm, pieces), axis=0)


def sends_twice(comm, x):  # right result, but every rank sends its whole x to the right first
    comm.sendrecv((comm.rank + 1) % comm.world_size, x, (comm.rank - 1) % comm.world_size, tag="extra")
    return fused(comm, x)


def by_columns(comm, x):  # pieces of columns are views the kernels cannot write into
    pieces = np.array_split(x.copy(), comm.world_size, axis=1)
    reduce_scatter_ring(comm, pieces, "sum", last=lambda acc, incoming: kernels.add_layernorm(acc, incoming, out=acc))
    return np.concatenate(all_gather_ring(comm, pieces), axis=1)


def by_column_copies(comm, x):  # contiguous copies of columns: it runs, and normalises the wrong thing
    pieces = [p.copy() for p in np.array_split(x, comm.world_size, axis=1)]
    reduce_scatter_ring(comm, pieces, "sum", last=lambda acc, incoming: kernels.add_layernorm(acc, incoming, out=acc))
    return np.concatenate(all_gather_ring(comm, pieces), axis=1)


def returns_the_list(comm, x):
    pieces = np.array_split(x.copy(), comm.world_size, axis=0)
    reduce_scatter_ring(comm, pieces, "sum", last=lambda acc, incoming: kernels.add_layernorm(acc, incoming, out=acc))
    return all_gather_ring(comm, pieces)


def in_float64(comm, x):
    pieces = np.array_split(x.astype(np.float64), comm.world_size, axis=0)
    reduce_scatter_ring(comm, pieces, "sum", last=lambda acc, incoming: kernels.add_layernorm(acc, incoming, out=acc))
    return np.concatenate(all_gather_ring(comm, pieces), axis=0)


def one_array_norm_as_last(comm, x):  # last(acc, incoming) = layernorm(acc, gamma=incoming)
    pieces = np.array_split(x.copy(), comm.world_size, axis=0)
    reduce_scatter_ring(comm, pieces, "sum", last=kernels.layernorm)
    return np.concatenate(all_gather_ring(comm, pieces), axis=0)


def calls_last_itself(comm, x):  # passes the result of a call, not a function
    pieces = np.array_split(x.copy(), comm.world_size, axis=0)
    reduce_scatter_ring(comm, pieces, "sum", last=kernels.add_layernorm(pieces[0], pieces[0]))
    return np.concatenate(all_gather_ring(comm, pieces), axis=0)


def splits_by_rank(comm, x):  # ranks disagree on the pieces
    pieces = np.array_split(x.copy(), comm.world_size + comm.rank % 2, axis=0)
    reduce_scatter_ring(comm, pieces, "sum", last=lambda acc, incoming: kernels.add_layernorm(acc, incoming, out=acc))
    return np.concatenate(all_gather_ring(comm, pieces), axis=0)


def returns_x(comm, x):
    pieces = np.array_split(x.copy(), comm.world_size, axis=0)
    reduce_scatter_ring(comm, pieces, "sum", last=lambda acc, incoming: kernels.add_layernorm(acc, incoming, out=acc))
    all_gather_ring(comm, pieces)
    return x


def my_fused(comm, x):
    """The scaffold as the lesson ships it."""
    ...  # your code here, in place of `...`


@pytest.mark.processes
def test_right_answer_passes_on_grpc_and_reports_rows_and_bytes():
    feedback = check_fused(reference("07.1"))  # the registered solution, shipped by value
    assert feedback, feedback
    assert "normalised [4, 3, 3, 3] rows" in feedback.message and "7488 bytes" in feedback.message


def test_a_lambda_with_add_layernorm_passes_too():
    assert check_fused(fused, world_sizes=(3, 4), transport="local")


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
    (by_column_copies, ["slices of columns", "axis 0", "np.array_split(x.copy(), N, axis=0)"]),
    (returns_the_list, ["returned a list of 3 arrays", "np.concatenate"]),
    (in_float64, ["returned float64 rows", "keep x's dtype"]),
    (returns_x, ["its own x, unchanged"]),
])
def test_wrong_answers_get_specific_hints(fn, words):
    feedback = check_fused(fn, **QUICK)
    assert not feedback
    for word in words:
        assert word in feedback.message, feedback


@pytest.mark.parametrize("fn, words", [
    (by_columns, ["not whole rows", "slice of columns", "split along axis 0", "axis=0)"]),
    (one_array_norm_as_last, ["last(acc, incoming)", "kernels.add_layernorm(acc, incoming, out=acc)"]),
    (calls_last_itself, ["takes a function", "lambda"]),
    (splits_by_rank, ["different shapes", "the same way"]),
])
def test_library_errors_come_with_a_hint(fn, words):
    feedback = check_fused(fn, **QUICK)
    assert not feedback and feedback.attempted
    for word in words:
        assert word in feedback.message, feedback


def test_kernels_are_restored_after_a_check():
    originals = kernels.layernorm, kernels.add_layernorm, kernels.rmsnorm, kernels.sum_layernorm
    check_fused(unfused, **QUICK)
    assert (kernels.layernorm, kernels.add_layernorm, kernels.rmsnorm, kernels.sum_layernorm) == originals


@pytest.mark.parametrize("answer, hint", [(2 * 11 / 12 * 2**20, "ring"), (22 * 2**20, "all ranks send together"),
                                          (4 * 2**20, "rank 0's count"), (2 * 2**20, "broadcast only"),
                                          (2**20, "reduce only"), (3, "multiply by S"),
                                          (3e6, "not 10^6"), (24 * 2**20, "not bits"), (5, "not it"),
                                          ("lots", "number of bytes")])
def test_root_bytes(answer, hint):
    assert check_root_bytes(3 * 2**20)
    feedback = check_root_bytes(answer)
    assert not feedback and hint in feedback.message, feedback


def test_root_bytes_are_what_the_root_variant_sends():
    """root_sends walks the same binomial trees the library's root variant runs (every rank, N = 12)."""
    def sends(comm):
        reduce_layernorm_broadcast(comm, np.ones((3, 8), np.float32), variant="root")

    with Cluster(12, transport="local") as cluster:
        cluster.run(sends)
        counted = cluster.trace.messages_sent()
    assert [counted.get(r, 0) for r in range(12)] == [sum(root_sends(12, r)) for r in range(12)]
    assert check_root_bytes(2 * 2**20, world_size=8)  # rank 2 of 8: its partial sum, then to rank 6
    assert check_root_bytes(4 * 2**20, world_size=12, rank=1)  # rank 1 sends as much as rank 0


def test_fusion_answer():
    assert check_fusion_answer("b")
    assert "never inside a row" in check_fusion_answer("a").message
    assert "np.array_split" in check_fusion_answer("c").message
    assert "nothing to normalise" in check_fusion_answer("d").message
    assert "'a', 'b', 'c' or 'd'" in check_fusion_answer("e").message


def test_the_scaffolds_are_not_attempts():
    for feedback, exercise in ((check_fused(my_fused), "07.1"), (check_root_bytes(None), "07.2"),
                               (check_fusion_answer("?"), "07.3")):
        assert not feedback and not feedback.attempted, feedback
        assert f'hint("{exercise}")' in feedback.message


def test_solutions_are_registered_and_the_fused_solution_runs():
    for exercise, kind in (("07.1", "code"), ("07.2", "number"), ("07.3", "choice")):
        ex = registry.get(exercise)
        assert ex.kind == kind and ex.solution and len(ex.hints) >= (2 if kind == "code" else 1)
    assert "3145728" in registry.get("07.2").solution and registry.get("07.3").solution.startswith("b")
    fn = reference("07.1")
    assert fn.__name__ == "my_fused"
    assert check_fused(fn, world_sizes=(4,), transport="local")


@pytest.mark.parametrize("exercise", ["07.2", "07.3"])
def test_the_key_cells_pass(exercise):
    *body, last = registry.get(exercise).key.splitlines()
    namespace = {}
    exec("\n".join([*body, f"result = {last}"]), namespace)  # noqa: S102 - our own key
    assert namespace["result"], namespace["result"]
