"""No thread outlives close(): the rank servers' and the Lighthouse's (grpc's server.stop() leaves
its executor's threads idle until garbage collection unless they are shut down)."""

from __future__ import annotations

import threading
import time

import numpy as np

from allreduce_edu.runtime.transports import TRANSPORTS
from allreduce_edu.training.elastic import Lighthouse, LighthouseClient


def _left(names_before: set[int], prefix: tuple[str, ...], wait: float = 3.0) -> list[str]:
    """The threads started since `names_before` whose names begin with `prefix`, once they have
    had `wait` seconds to end."""
    deadline = time.monotonic() + wait
    while True:
        left = [t.name for t in threading.enumerate()
                if t.ident not in names_before and t.name.startswith(prefix)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def test_two_grpc_ranks_leave_no_server_thread_after_close():
    before = {t.ident for t in threading.enumerate()}
    comms = [TRANSPORTS["grpc"].communicator(r, 2, token="t" * 32, timeout=5) for r in range(2)]
    try:
        for comm in comms:
            threading.Thread(target=comm.connect, args=([c.address for c in comms],)).start()
        time.sleep(0.5)
        comms[0].send(1, np.arange(4.0), "hello")
        assert comms[1].recv(0, "hello").tolist() == [0.0, 1.0, 2.0, 3.0]
    finally:
        for comm in comms:
            comm.close(drain=0.5)
    assert _left(before, ("rank0-server", "rank1-server")) == []


def test_the_lighthouse_leaves_no_server_thread_after_close():
    before = {t.ident for t in threading.enumerate()}
    with Lighthouse(min_replicas=1, heartbeat_timeout=1.0) as lighthouse:
        client = LighthouseClient(lighthouse.address, lighthouse.token, "a")
        assert client.call("Quorum", 10, step=0)["members"]
        client.close()
    assert _left(before, ("lighthouse",)) == []
