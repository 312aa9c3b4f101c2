"""Synchronous sends (comm.ssend, MPI's MPI_Ssend): a send that returns once the receiver took it.

On every transport of the package: it returns only after the matching recv, and "every rank sends
before it receives" ends in a CollectiveTimeout at the deadline that names the rank and its peer.
"""

import re
import time

import numpy as np
import pytest

from allreduce_edu import Cluster, CollectiveTimeout

TRANSPORTS = ["local", pytest.param("grpc", marks=pytest.mark.processes),
              pytest.param("shm", marks=pytest.mark.processes)]
LATE = 0.4  # seconds rank 1 waits before it receives


def _ssend_then_late_recv(comm):
    """Rank 0 ssends to rank 1, which receives LATE seconds later; the others do nothing."""
    comm.barrier()  # the ranks start together: rank 1's sleep begins as rank 0's ssend does
    if comm.rank == 0:
        t0 = time.monotonic()
        comm.ssend(1, np.arange(5.0), "a")
        return time.monotonic() - t0
    if comm.rank == 1:
        time.sleep(LATE)
        return comm.recv(0, "a").tolist()
    return None


def _every_rank_ssends_first(comm, count):
    n, r = comm.world_size, comm.rank
    comm.ssend((r + 1) % n, np.ones(count), "step0")
    return comm.recv((r - 1) % n, "step0")


def _issend_recv_wait(comm):
    """The sendrecv pattern on synchronous sends: post, receive, then wait: never deadlocks."""
    n, r = comm.world_size, comm.rank
    request = comm.issend((r + 1) % n, np.full(4, float(r)), "x")
    received = comm.recv((r - 1) % n, "x")
    request.wait()
    return received.tolist()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_ssend_returns_after_the_matching_recv_and_deadlocks_loudly(transport):
    with Cluster(3, transport=transport, timeout=1.5) as cluster:
        waited, received, _ = cluster.run(_ssend_then_late_recv)
        assert received == [0.0, 1.0, 2.0, 3.0, 4.0]
        assert waited >= LATE * 0.9  # it waited for the receiver, not just for the bytes to leave

        assert cluster.run(_issend_recv_wait) == [[2.0] * 4, [0.0] * 4, [1.0] * 4]

        t0 = time.monotonic()
        with pytest.raises(CollectiveTimeout) as raised:
            cluster.run(_every_rank_ssends_first, 10)  # tiny messages: still no buffering
        assert time.monotonic() - t0 < 10  # at its deadline: never a hang
        text = str(raised.value)
        found = re.search(r"rank (\d): rank (\d) did not take 'step0' \(80 bytes\) before the "
                          r"deadline", text)
        assert found, text
        rank, peer = map(int, found.groups())
        assert peer == (rank + 1) % 3
        assert raised.value.waiting_for is None  # outside a collective: no collective's wait

        # the world is usable again after the deadlock: receipts of the failed run are gone
        assert cluster.run(_issend_recv_wait) == [[2.0] * 4, [0.0] * 4, [1.0] * 4]


def _two_issends_waited_last_first(comm):
    """Rank 0 issends two messages with one tag and waits for the second first; rank 1 takes the
    first at once and the second a while later: the second's wait must last until then."""
    comm.barrier()
    if comm.rank == 0:
        first, second = (comm.issend(1, np.full(2, float(k)), "same") for k in (1, 2))
        t0 = time.monotonic()
        second.wait()
        waited = time.monotonic() - t0
        first.wait()
        return waited
    first = comm.recv(0, "same").tolist()
    time.sleep(LATE)
    return [first, comm.recv(0, "same").tolist()]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_each_synchronous_send_waits_for_its_own_receipt(transport):
    with Cluster(2, transport=transport, timeout=5) as cluster:
        waited, received = cluster.run(_two_issends_waited_last_first)
    assert received == [[1.0, 1.0], [2.0, 2.0]]
    assert waited >= LATE * 0.9  # not released by the first message's receipt


def test_plain_send_stays_eager():
    """Without ssend nothing changes: every rank sending first still finishes."""
    def every_rank_sends_first(comm):
        n, r = comm.world_size, comm.rank
        comm.send((r + 1) % n, np.ones(3), "step0")
        return comm.recv((r - 1) % n, "step0").sum()

    with Cluster(3, transport="local", timeout=1.5) as cluster:
        assert cluster.run(every_rank_sends_first) == [3.0, 3.0, 3.0]


def test_a_reserved_tag_is_refused():
    def send_marker(comm):
        if comm.rank == 0:
            comm.ssend(1, np.ones(1), "\x00taken\x00x")

    def recv_marker(comm):
        comm.recv(1 - comm.rank, "\x00ssend\x00x")

    with Cluster(2, transport="local", timeout=1.0) as cluster:
        for fn in (send_marker, recv_marker):
            with pytest.raises(ValueError, match="reserved"):
                cluster.run(fn)
