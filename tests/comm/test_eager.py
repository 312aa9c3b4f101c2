"""Eager slots (shm/eager.py): a link's small messages through a ring in shared memory, each
8-byte word carrying 4 bytes of the frame and the message's number (NCCL's LL protocol)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from conftest import cluster_for

import allreduce_edu as ae
from allreduce_edu.comm.mailbox import Message
from allreduce_edu.comm.transports.shm import eager
from allreduce_edu.comm.transports.shm.backend import INLINE_BYTES
from allreduce_edu.comm.transports.shm.doorbell import pack, unpack
from allreduce_edu.comm.transports.shm.eager import CAPACITY, HEAD_WORDS, SLOT_WORDS, SLOTS


class _Memory:  # a segment as the rings see one: its bytes
    def __init__(self):
        self.bytes = np.zeros(eager.RING_BYTES, np.uint8)


def _ring():
    memory = _Memory()
    return eager.Outgoing(memory), eager.Incoming(memory)


def _head(seq: int) -> bytes:  # a frame's header (doorbell.pack) with the link's sequence number
    return pack(Message(0, "t", np.zeros(0, np.uint8)), seq)


def _seq(frame) -> int:
    return unpack(frame)[0].seq


def test_a_frame_goes_through_a_slot_whole_and_the_slot_comes_back():
    out, into = _ring()
    data = np.arange(5, dtype=np.float32)
    assert into.peek() is None and not into.ready()
    assert out.put(_head(1), data)
    frame = into.peek()
    assert into.ready() and _seq(frame) == 1
    assert bytes(frame) == _head(1) + data.tobytes()
    into.advance()
    assert into.peek() is None and int(out.words[0]) == 1  # taken: the writer may reuse it


def test_the_ring_wraps_refuses_when_full_and_never_takes_a_stale_slot():
    out, into = _ring()
    for i in range(SLOTS):
        assert out.put(_head(i + 1), np.array([i], np.int64))
    assert not out.put(_head(99), np.array([0], np.int64))  # full: the socket takes it instead
    for lap in range(3):
        for i in range(SLOTS):
            frame = into.peek()
            n = lap * SLOTS + i + 1
            assert _seq(frame) == n
            into.advance()
            assert out.put(_head(n + SLOTS), np.array([n], np.int64))
    # each slot now holds a frame one lap newer than the last one taken from it; nothing older
    # passes: the reader's next slot holds exactly the next message
    assert _seq(into.peek()) == 3 * SLOTS + 1


def test_a_frame_longer_than_a_slot_goes_elsewhere():
    out, into = _ring()
    assert not out.put(_head(1), np.zeros(CAPACITY, np.uint8))
    assert out.put(_head(1), np.zeros(CAPACITY - len(_head(1)), np.uint8))
    assert len(into.peek()) == CAPACITY


def test_a_half_written_frame_is_not_taken_and_a_lying_length_is_refused():
    out, into = _ring()
    assert out.put(_head(1), np.arange(100, dtype=np.uint8))
    words = out.words[HEAD_WORDS:HEAD_WORDS + SLOT_WORDS]
    kept = int(words[10])
    words[10] = kept & 0xFFFFFFFF  # word 10 still carries an older flag: not there yet
    assert into.peek() is None
    words[10] = kept
    assert into.peek() is not None
    words[0] = (1 << 32) | (CAPACITY + 4)
    with pytest.raises(ValueError, match="holds"):
        into.peek()


def test_a_sleeping_reader_is_seen_by_the_writer():
    out, into = _ring()
    assert not out.asleep()
    with into.asleep():
        assert out.asleep()
        with into.asleep():  # two threads of the reader
            pass
        assert out.asleep()
    assert not out.asleep()


# --- on rank processes ----------------------------------------------------------------------
SIZES = [8, 4, 2000, 0, 40_000, 16, 3 << 20, 8, 1, CAPACITY - 200, INLINE_BYTES + 1, 8]


def _mixed(comm, rounds):
    """Rank 1 sends messages of every kind (ring, inline frames on the socket, segments) on one
    tag, then a burst longer than the ring while rank 0 sleeps; rank 0 checks their order. The
    ring fills and the rest goes on the socket, unless rank 0's link thread (which reads once
    the link has had no recv for QUIET, as on a fresh cluster) empties the ring meanwhile."""
    link = comm.nearby.links[1 - comm.rank]
    sizes = SIZES * rounds + [8] * (3 * SLOTS)
    if comm.rank == 1:
        before = link.outgoing.sent  # the cluster may have served other tests: count this one's
        for i, size in enumerate(sizes):
            comm.send(0, np.full(size, i % 251, np.uint8), "mixed")
        return link.outgoing.sent, link.outgoing.sent - before
    time.sleep(0.5)  # the whole burst is sent meanwhile (where it goes: the docstring)
    for i, size in enumerate(sizes):
        got = comm.recv(1, "mixed")
        assert got.shape == (size,) and (got == i % 251).all(), (i, size)
    return link.incoming.taken


@pytest.mark.processes
def test_ring_socket_and_segments_keep_one_order(shm_backend):
    taken, (sent, sent_here) = cluster_for("shm", 2, backend=shm_backend).run(_mixed, 3)
    assert taken == sent  # every message the ring ever carried on this link was taken, once
    fits = sum(size <= CAPACITY - 200 for size in SIZES) * 3 + 3 * SLOTS  # a header: < 200 B
    assert SLOTS <= sent_here <= fits  # a ring's worth at least, and none too big for a slot


def _counts(link):
    """(messages taken from the ring, messages assembled): read together, as no reader is between
    taking a message and assembling it (the peer's first ping may be arriving meanwhile)."""
    with link._reading:
        return link.incoming.taken, link.assembler.messages


def _pingpong(comm, rounds):
    link = comm.nearby.links[1 - comm.rank]
    before = _counts(link)
    comm.barrier()
    x = np.arange(2, dtype=np.float32)
    for i in range(rounds):
        if comm.rank == 0:
            comm.send(1, x + i, "ping")
            assert (comm.recv(1, "pong") == x + i).all()
        else:
            comm.send(0, comm.recv(0, "ping"), "pong")
        if i % 50 == 0:
            time.sleep(0.02)  # the peer falls asleep on its socket: the doorbell wakes it
    after = _counts(link)
    return after[0] - before[0], after[1] - before[1], link.doorbells


@pytest.mark.processes
def test_small_messages_travel_through_the_ring_and_a_sleeping_peer_is_woken(shm_backend):
    (ring0, all0, rang0), (ring1, all1, rang1) = cluster_for("shm", 2, backend=shm_backend).run(
        _pingpong, 200)
    assert ring0 == all0 >= 200 and ring1 == all1 >= 200  # every message came through the ring
    assert rang0 + rang1 >= 1  # a peer that slept was woken through its socket


def _forge_ring(comm, length):
    """Rank 1 writes a whole slot (every flag set) that says it holds `length` bytes: more than a
    slot holds, or too few for a header; rank 0's recv must refuse the link."""
    if comm.rank == 1:
        ring = comm.nearby.links[0].outgoing
        ring.words[HEAD_WORDS + 1:HEAD_WORDS + 1 + (min(length, CAPACITY) + 3) // 4] = 1 << 32
        ring.words[HEAD_WORDS] = (1 << 32) | length
        return None
    try:
        comm.recv(1, "x", timeout=10)
    except ae.RankFailure as e:
        return str(e)


def _replay_ring(comm):
    """Rank 1 writes a whole, well-formed frame numbered 0: a message the link has had already."""
    if comm.rank == 1:
        comm.nearby.links[0].outgoing.put(_head(0), np.zeros(0, np.uint8))
        return None
    try:
        comm.recv(1, "x", timeout=10)
    except ae.RankFailure as e:
        return str(e)


@pytest.mark.processes
def test_a_ring_frame_numbered_behind_the_link_is_refused_not_left_in_its_slot():
    cluster = ae.Cluster(2, transport="shm", timeout=10)
    try:
        said = cluster.run(_replay_ring)[0]
    finally:
        cluster.close()
    assert "breaks the contract" in said and "numbered 0 after message 0" in said, said


@pytest.mark.processes
@pytest.mark.parametrize("length, why", [(CAPACITY + 8, "holds"), (4, "inside its header")])
def test_a_peer_that_writes_a_broken_slot_is_refused_by_name(length, why):
    cluster = ae.Cluster(2, transport="shm", timeout=10)
    try:
        said = cluster.run(_forge_ring, length)[0]
    finally:
        cluster.close()
    assert "breaks the contract" in said and why in said and "rank 1" in said
