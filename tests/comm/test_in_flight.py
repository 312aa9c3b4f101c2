"""In-flight links: α is latency on the wire, so a port sends its next message while the last one is
still travelling; the courier posts each message when it arrives, in the order it was sent."""

from __future__ import annotations

import time

import numpy as np
import pytest

import allreduce_edu as ae
from allreduce_edu.model.links import Link, Links, Ports


def test_a_port_is_held_for_the_bytes_and_the_message_arrives_alpha_later():
    ports = Ports(3)
    free1, arrived1 = ports.book(0, 1, 0.5, latency=2.0)
    free2, arrived2 = ports.book(0, 2, 0.5, latency=2.0)  # the same egress: right after the first
    assert free2 - free1 == pytest.approx(0.5) and arrived2 - free2 == pytest.approx(2.0)
    assert arrived1 - free1 == pytest.approx(2.0)
    free3, arrived3 = ports.book(2, 1, 0.5, latency=2.0)  # rank 1's ingress: after the first lands
    assert arrived3 - arrived1 == pytest.approx(0.5, abs=1e-3) and free3 < arrived1
    stored = Ports(2)
    free, arrived = stored.book(0, 1, 0.5)  # store and forward: the ports until it has arrived
    assert free == arrived


def test_a_link_in_flight_holds_its_ports_for_the_bytes_only():
    link = Link(1e-3, 1e-9, in_flight=True)
    assert link.port_seconds(1000) == pytest.approx(1e-6) and link.seconds(1000) == pytest.approx(1e-3 + 1e-6)
    assert Link(1e-3, 1e-9).port_seconds(1000) == pytest.approx(1e-3 + 1e-6)
    assert "in flight" in str(link) and "in flight" not in str(Link(1e-3, 1e-9))
    assert Links.flat("1ms", "1GB/s", in_flight=True).uniform == link
    assert ae.TESTBED_IN_FLIGHT.uniform.in_flight and not ae.TESTBED.uniform.in_flight


def test_transmit_says_when_an_in_flight_message_arrives():
    flight = Links.flat("2ms", "1GB/s", in_flight=True).attach(2)
    before = time.monotonic()
    arrives = flight.transmit(0, 1, 1000)
    assert arrives is not None and arrives >= before + 2e-3
    assert Links.flat("1us", "1GB/s").attach(2).transmit(0, 1, 1000) is None  # already there
    assert flight.transmit(1, 1, 1000) is None  # to itself: no link


def _many_in_order(comm, count):
    if comm.rank == 0:
        requests = [comm.isend(1, np.full(3, i), "x") for i in range(count)]
        for request in requests:
            request.wait()
        return []
    return [int(comm.recv(0, "x")[0]) for _ in range(count)]


@pytest.mark.parametrize("transport", ["local", pytest.param("grpc", marks=pytest.mark.processes), pytest.param("shm", marks=pytest.mark.processes)])
def test_messages_in_flight_arrive_whole_and_in_order(transport):
    links = Links.flat("1ms", "1GB/s", in_flight=True)
    with ae.Cluster(2, transport=transport, links=links) as cluster:
        assert cluster.run(_many_in_order, 40)[1] == list(range(40))


def _reuse_the_buffer(comm):
    x = np.zeros(4)
    if comm.rank == 0:
        request = comm.isend(1, x, "x")
        x[:] = 7  # eager: the message took a copy when it left
        request.wait()
        return None
    return comm.recv(0, "x")


def test_the_sender_may_reuse_its_array_while_the_message_is_in_flight():
    links = Links.flat("5ms", "1GB/s", in_flight=True)
    with ae.Cluster(2, transport="local", links=links) as cluster:
        assert np.array_equal(cluster.run(_reuse_the_buffer)[1], np.zeros(4))
