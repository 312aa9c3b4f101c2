"""Two "hosts" as Linux network namespaces joined by a veth pair: `allreduce-edu launch` across them.

Needs root and iproute2 (CI runs as root and installs it); skips with the reason elsewhere. Traffic
stays between 192.0.2.1 and 192.0.2.2 (TEST-NET-1), addresses that exist only inside the namespaces.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ("192.0.2.1", "192.0.2.2")

RANK_SCRIPT = """
    import numpy as np
    import allreduce_edu as ae

    comm = ae.init()
    n, r = comm.world_size, comm.rank
    for dtype in ("float32", "int64"):
        x = (np.arange(1000) % 13 + r).astype(dtype)  # rank r contributes (i mod 13) + r
        expected = (n * (np.arange(1000) % 13) + n * (n - 1) // 2).astype(dtype)
        for algorithm in ("ring", "tree", "hierarchical"):
            y = ae.allreduce(comm, x, algorithm=algorithm)
            assert np.array_equal(y, expected), (algorithm, dtype, y[:5])
        assert np.array_equal(ae.allreduce(comm, x, "max", "ring"), x - r + n - 1)
    print(f"rank {r} of {n} at {comm.address}: ring, tree, hierarchical correct")
    comm.trace.clear()
    ae.allreduce(comm, x, algorithm="hierarchical")
    carried = sorted({(e.dst, e.via) for e in comm.trace.events})
    print(f"rank {r} sent its hierarchical messages: {carried}")
"""


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=False, capture_output=True, text=True, timeout=20)


@pytest.fixture
def two_hosts():
    """Namespaces A (192.0.2.1) and B (192.0.2.2) joined by a veth pair; removed afterwards, whatever happens."""
    if not sys.platform.startswith("linux") or not hasattr(os, "geteuid"):
        pytest.skip("network namespaces (ip netns) and root (os.geteuid): Linux only")
    if shutil.which("ip") is None:
        pytest.skip("iproute2's `ip` is not installed (apt-get install iproute2)")
    if os.geteuid() != 0:
        pytest.skip("creating network namespaces (ip netns add) needs root")
    suffix = f"{os.getpid() % 100000}{secrets.token_hex(2)}"
    names, links = (f"aeduA{suffix}", f"aeduB{suffix}"), (f"veA{suffix}", f"veB{suffix}")
    created = []
    try:
        for ns in names:
            result = ip("netns", "add", ns)
            if result.returncode:
                pytest.skip(f"cannot create a network namespace here: {result.stderr.strip()}")
            created.append(ns)
        steps = [("link", "add", links[0], "type", "veth", "peer", "name", links[1])]
        for ns, link, host in zip(names, links, HOSTS):
            steps += [("link", "set", link, "netns", ns), ("-n", ns, "addr", "add", f"{host}/24", "dev", link),
                      ("-n", ns, "link", "set", link, "up"), ("-n", ns, "link", "set", "lo", "up")]
        for step in steps:
            result = ip(*step)
            assert result.returncode == 0, f"ip {' '.join(step)}: {result.stderr}"
        yield names
    finally:
        for ns in created:  # deleting a namespace deletes its end of the veth pair, and so the pair
            ip("netns", "del", ns)


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.parametrize("transport", ["grpc", "shm"])
def test_launch_across_two_hosts_runs_ring_and_tree(two_hosts, tmp_path, transport):
    """With --transport shm, ranks on one host use shared memory, and gRPC across hosts."""
    script = tmp_path / "rank_script.py"
    script.write_text(textwrap.dedent(RANK_SCRIPT))
    env = dict(os.environ, ALLREDUCE_EDU_TOKEN=secrets.token_hex(16))  # the shared token: never on a command line
    nodes = []
    try:
        for node_rank, ns in reversed(list(enumerate(two_hosts))):  # node 1 first: it waits for rank 0
            command = ["ip", "netns", "exec", ns, sys.executable, "-m", "allreduce_edu.cli", "launch",
                       "--nnodes", "2", "--node-rank", str(node_rank), "-n", "2", "--rendezvous",
                       f"{HOSTS[0]}:29500", "--rendezvous-timeout", "30", "--timeout", "30",
                       "--transport", transport, str(script)]
            nodes.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, start_new_session=True))
        outputs = [node.communicate(timeout=90) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert all("without TLS" in err for _, err in outputs)  # each launcher says the network sees it
    text = "".join(out for out, _ in outputs)
    for rank, host in ((0, HOSTS[0]), (1, HOSTS[0]), (2, HOSTS[1]), (3, HOSTS[1])):
        assert f"rank {rank} of 4 at {host}:" in text and "ring, tree, hierarchical correct" in text, text
        # hierarchical: the node's partner inside the host, the same local rank on the other host
        partner, remote = rank ^ 1, rank ^ 2
        inside = "shm" if transport == "shm" else "grpc"
        assert f"rank {rank} sent its hierarchical messages: {sorted([(partner, inside), (remote, 'grpc')])}" in text, text
