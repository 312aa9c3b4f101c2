"""gloo_ring, gloo's ring add for add (without torch: the order written out in NumPy; with torch,
tests/training/test_compress_hooks.py checks it against gloo itself)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import cluster_for

from allreduce_edu.training.compress import allreduce_fp16
from allreduce_edu.training.compress.gloo_order import gloo_chunks, gloo_ring


def data(rank: int, size: int) -> np.ndarray:
    return np.random.default_rng([3, rank]).standard_normal(size).astype(np.float16)


def in_gloo_s_order(world_size: int, size: int) -> np.ndarray:
    """Chunk k summed from rank k-1 down to rank k, one fp16 rounding per addition."""
    out = np.empty(size, np.float16)
    for k, part in enumerate(gloo_chunks(size, 2, world_size)):
        acc = data((k - 1) % world_size, size)[part]
        for hop in range(2, world_size + 1):
            acc = acc + data((k - hop) % world_size, size)[part]
        out[part] = acc
    return out


def on_rank(comm, size):
    return gloo_ring(comm, data(comm.rank, size))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 5, 8])
def test_every_rank_gets_the_sum_added_in_gloo_s_order(world_size):
    cluster = cluster_for("local", world_size)
    for size in (0, 3, 10, 257):
        results = cluster.run(on_rank, size)
        want = in_gloo_s_order(world_size, size)
        for rank, got in enumerate(results):
            assert got.dtype == np.float16 and got.tobytes() == want.tobytes(), (rank, size)
        # rank r sends every chunk but its own (r) while reducing, every one but r - 1's while
        # gathering; 2 bytes a value
        chunks = [s.stop - s.start for s in gloo_chunks(size, 2, world_size)]
        sent = {r: 2 * (sum(chunks) - chunks[r] + sum(chunks) - chunks[(r - 1) % world_size])
                for r in range(world_size) if world_size > 1}
        assert {r: b for r, b in cluster.trace.bytes_sent().items() if b} == {
            r: b for r, b in sent.items() if b}, size


def test_gloo_s_chunks_are_whole_segments_and_may_be_empty():
    # 10 values, 4 ranks: 8 segments of 2 values, two per rank; the last rank gets none
    assert [(s.start, s.stop) for s in gloo_chunks(10, 2, 4)] == [(0, 4), (4, 8), (8, 10), (10, 10)]
    # 3 Mi fp16 values on 2 ranks: 6 MiB in 1 MiB segments, three per rank
    assert [(s.start, s.stop) for s in gloo_chunks(3 * 2**20, 2, 2)] == [(0, 3 * 2**19),
                                                                          (3 * 2**19, 3 * 2**20)]
    for n in range(1, 9):
        for count in (0, 1, 7, 1000, 2**21 + 3):
            parts = gloo_chunks(count, 4, n)
            assert parts[0].start == 0 and parts[-1].stop == count
            assert all(a.stop == b.start for a, b in zip(parts, parts[1:]))


def test_the_order_changes_the_bits_and_the_fp16_hook_takes_either():
    cluster = cluster_for("local", 4)
    ring = cluster.run(lambda comm: allreduce_fp16(comm, data(comm.rank, 1001), "ring"))[0]
    gloo = cluster.run(lambda comm: allreduce_fp16(comm, data(comm.rank, 1001), gloo_ring))[0]
    assert (ring != gloo).any()  # the same sum, added in another order
    np.testing.assert_allclose(ring, gloo, atol=2e-3)


def test_only_sum():
    cluster = cluster_for("local", 2)
    with pytest.raises(Exception, match="gloo_ring sums"):
        cluster.run(lambda comm: gloo_ring(comm, data(comm.rank, 4), op="max"))
