"""Shared fixtures: clusters are expensive to start, so each world size is started once per session."""

from __future__ import annotations

import multiprocessing
import os
import tempfile

import pytest

# Checkers record progress; tests and the lessons' nbval kernels (which inherit this environment) must never
# write to the home directory (a fresh folder per run, inside $ALLREDUCE_EDU_DATA_DIR when .ci/run sets it).
_outer = os.environ.get("ALLREDUCE_EDU_DATA_DIR")
if _outer:
    os.makedirs(_outer, exist_ok=True)
os.environ["ALLREDUCE_EDU_DATA_DIR"] = tempfile.mkdtemp(prefix="allreduce-edu-test-data-", dir=_outer or None)

import allreduce_edu as ae  # noqa: E402 - after the data folder is set

_clusters: dict[tuple[str, int], ae.Cluster] = {}


def cluster_for(transport: str, world_size: int, timeout: float = 30.0) -> ae.Cluster:
    """A running cluster of this size, shared by every test that asks for one (restarted if broken)."""
    key = (transport, world_size)
    cluster = _clusters.get(key)
    if cluster is None or cluster.closed:
        cluster = _clusters[key] = ae.Cluster(world_size, transport=transport, timeout=timeout)
    elif "dead" in repr(cluster):
        cluster.restart()
    return cluster


@pytest.fixture(scope="session", autouse=True)
def _close_clusters():
    yield
    for cluster in _clusters.values():
        cluster.close()


@pytest.fixture(params=["local", "grpc"])
def transport(request) -> str:
    return request.param


@pytest.fixture
def no_leftover_processes():
    """Fail a test that leaves rank processes behind."""
    before = set(multiprocessing.active_children())
    yield
    leftover = [p for p in multiprocessing.active_children() if p not in before and p.name.startswith("allreduce-edu")]
    assert not leftover, f"rank processes left running: {leftover}"
