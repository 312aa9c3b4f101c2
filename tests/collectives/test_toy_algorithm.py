"""A new algorithm is one registration: it runs, replays, animates, is predicted and benchmarks, untouched elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

import allreduce_edu as ae
from allreduce_edu.bench import allreduce as bench
from allreduce_edu.collectives import registry
from allreduce_edu.model.costmodel import predict
from allreduce_edu.viz import NaiveAnimation, animate
from allreduce_edu.viz.replay import replay


@pytest.fixture
def toy():
    """'gather_all': everyone sends to everyone in rank order, one step per sender (N-1 steps of S)."""

    def cost(n, s, alpha, beta, gamma=0.0):
        return (n - 1) * (alpha + (n - 1) * s * beta) + (n - 1) * s * gamma

    @registry.allreduce_algorithm("gather_all", layout="star", phases=("gather",), cost=cost, colour="#123456")
    def allreduce_gather_all(comm, x, op="sum"):
        """Rank by rank, each sends its whole buffer to all others."""
        acc = None
        for src in range(comm.world_size):
            # step src: rank src sends x to every other rank, the others receive it
            if src == comm.rank:
                requests = [comm.isend(dst, x, "gather", step=src) for dst in range(comm.world_size) if dst != src]
                for request in requests:
                    request.wait()
                part = x
            else:
                part = comm.recv(src, "gather")
            acc = part.copy() if acc is None else registry.reduce_into(acc, part, op)
        return acc

    yield "gather_all"
    registry.unregister("gather_all")
    assert "gather_all" not in ae.collectives.ALGORITHMS


def test_a_registered_toy_algorithm_works_everywhere(toy):
    n = 4
    values = [np.arange(6.0) * 10 ** r for r in range(n)]
    with ae.Cluster(n, transport="local") as cluster:
        results = cluster.run(lambda comm: ae.allreduce(comm, values[comm.rank], algorithm=toy))
        assert all(np.array_equal(r, sum(values)) for r in results)
        states = replay(cluster.trace, n, values=values)
        assert len(states) == 1 + n and states[-1].held[2][0] == frozenset(range(n))
        assert np.array_equal(states[-1].values[1][0], sum(values))
        animation = animate(cluster)
        assert isinstance(animation, NaiveAnimation) and animation.frame(len(states) - 1)[:4] == b"\x89PNG"
        rows = bench.combine(cluster.run(bench.measure, [toy], [64, 4096], iters=3, warmup=1))
    assert [r["algorithm"] for r in rows] == [toy, toy] and all(r["wrong"] == 0 for r in rows)
    assert predict(toy, n, 1 << 20, 1e-5, 1e-9) == pytest.approx(3 * (1e-5 + 3 * (1 << 20) * 1e-9))
    assert registry.describe(toy).colour == "#123456"
    assert registry.describe("allreduce/" + toy).summary == "Rank by rank, each sends its whole buffer to all others."


def test_a_layout_outside_the_known_ones_is_refused():
    with pytest.raises(ValueError, match="layout must be one of ring, star, tree, hypercube"):
        registry.allreduce_algorithm("spiral", layout="spiral")
