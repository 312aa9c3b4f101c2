"""The ring as the textbook has it (allreduce_ring_plain, shown after exercise 03.1) and the
variant the library runs (allreduce_ring, reduce_scatter_ring_into): the same sums, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import cluster_for

from allreduce_edu.collectives.ring import (
    all_gather_ring,
    allreduce_ring,
    allreduce_ring_plain,
    reduce_scatter_ring,
    reduce_scatter_ring_into,
)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("shape", [(7,), (2, 5), (1,)])
def test_the_plain_ring_is_the_sum_and_the_library_ring_gives_the_same_bits(n, shape):
    rng = np.random.default_rng(n)
    inputs = [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]

    def both(comm):
        x = inputs[comm.rank].copy()
        plain = allreduce_ring_plain(comm, x)
        assert np.array_equal(x, inputs[comm.rank])  # x itself is left as it was
        return plain, allreduce_ring(comm, x)

    for plain, library in cluster_for("local", n).run(both):
        assert plain.shape == shape
        np.testing.assert_allclose(plain, np.sum(inputs, axis=0), rtol=1e-5)
        assert np.array_equal(plain, library)  # one order of additions: the same bits


@pytest.mark.parametrize("op", ["sum", "max"])
def test_the_two_reduce_scatters_finish_the_same_chunk_and_only_into_leaves_its_pieces(op):
    def both(comm):
        pieces = np.array_split(np.arange(10.0) * (comm.rank + 1), comm.world_size)
        kept = [p.copy() for p in pieces]
        out = [np.empty_like(p) for p in pieces]
        into = reduce_scatter_ring_into(comm, pieces, out, op).copy()
        assert all(np.array_equal(a, b) for a, b in zip(pieces, kept))
        return into, reduce_scatter_ring(comm, pieces, op).copy()

    for into, plain in cluster_for("local", 4).run(both):
        assert np.array_equal(into, plain)


def test_last_finishes_the_final_chunk_in_both_and_all_gather_passes_every_chunk_on():
    def run(comm):
        pieces = [np.full(2, float(comm.rank)) for _ in range(comm.world_size)]
        mine = reduce_scatter_ring(comm, [p.copy() for p in pieces], last=lambda a, b: -(a + b))
        out = [np.empty(2) for _ in range(comm.world_size)]
        into = reduce_scatter_ring_into(comm, pieces, out, last=lambda a, b: -(a + b))
        gathered = all_gather_ring(comm, [np.full(1, comm.rank if i == comm.rank else -1.0)
                                          for i in range(comm.world_size)])
        return mine, into, gathered

    for mine, into, gathered in cluster_for("local", 3).run(run):
        assert mine.tolist() == into.tolist() == [-3.0, -3.0]  # -(0 + 1 + 2)
        assert [g.item() for g in gathered] == [0.0, 1.0, 2.0]
