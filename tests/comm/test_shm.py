"""The shared-memory transport: gRPC for control, segments and a doorbell socket for the bytes, on
each backend (linux: memfds and a Unix socket; portable: named shared memory and a loopback socket)."""

from __future__ import annotations

import os
import socket
import stat
import struct
import threading
import time

import numpy as np
import pytest
from conftest import DTYPES, check_allreduce, cluster_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import allreduce_edu as ae
from allreduce_edu.collectives import ALGORITHMS, OPS
from allreduce_edu.comm.transports import shm
from allreduce_edu.comm.transports.shm import backend, doorbell, linux, portable
from allreduce_edu.comm.transports.shm.backend import INLINE_BYTES
from allreduce_edu.comm.transports.shm.kinds import MESSAGE, RELEASE
from allreduce_edu.comm.transports.shm.segments import POOL_BYTES, Pool, size_class
from allreduce_edu.runtime.transports import TRANSPORTS

BACKENDS = ["linux", "portable"] if linux.available() else ["portable"]
needs_linux = pytest.mark.skipif(not linux.available(), reason="the linux shm backend needs memfd, seals, "
                                 "SO_PEERCRED and SOCK_SEQPACKET: Linux only")


@st.composite
def cases(draw):
    n = draw(st.sampled_from([2, 4]))
    size = draw(st.sampled_from([0, 1, 7, 97, INLINE_BYTES // 8 + 1, 100_003]))  # inline and in segments
    return (n, draw(st.sampled_from(sorted(ALGORITHMS))), draw(st.sampled_from(sorted(OPS))),
            draw(st.sampled_from(DTYPES)), size, draw(st.integers(0, 2**16)), draw(st.sampled_from(BACKENDS)))


@pytest.mark.processes
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_every_algorithm_op_dtype_and_size_on_shm(case):
    n, algorithm, op, dtype, size, seed, which = case
    check_allreduce(cluster_for("shm", n, backend=which), algorithm, op, (size,), dtype, seed)


def test_both_backends_implement_the_declared_seam():
    for cls in (linux.Linux, portable.Portable):
        assert isinstance(cls(), backend.Backend)
    made = portable.Portable().new_segment(1, 1 << 20)
    assert isinstance(made, backend.Segment)
    made.handed_over()
    made.unlink()
    listener = portable.Listener()
    with socket.create_connection(("127.0.0.1", int(listener.address.rpartition(":")[2]))):
        dialler = listener.accept(5)
        assert isinstance(dialler, backend.Dialler) and isinstance(listener, backend.Listener)
        assert isinstance(dialler.accept(1.0), backend.Channel)
        dialler.close()
    listener.close()
    if linux.available():
        assert isinstance(linux.MemfdSegment(1, 1 << 20), backend.Segment)
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        assert isinstance(linux.SeqpacketChannel(a, 1.0), backend.Channel)
        b.close()


def test_the_backend_is_chosen_by_the_environment(monkeypatch):
    monkeypatch.setenv(backend.ENV, "portable")
    assert shm.chosen() is portable.Portable
    monkeypatch.setenv(backend.ENV, "carrier-pigeon")
    with pytest.raises(ValueError, match="valid values are 'linux' and 'portable'"):
        shm.chosen()
    monkeypatch.delenv(backend.ENV)
    assert shm.chosen() is (linux.Linux if linux.available() else portable.Portable)


def _what_carried_a_ring(comm, count):
    ae.allreduce(comm, np.ones(count, np.float32), algorithm="ring")
    return comm.peers_on_shm(), {e.via for e in comm.trace.events}, sum(
        link.pool.total for link in (comm.nearby.links if comm.nearby else {}).values())


@pytest.mark.processes
def test_every_peer_on_this_machine_is_reached_through_shared_memory_and_the_trace_says_so(shm_backend):
    cluster = cluster_for("shm", 4, backend=shm_backend)
    for rank, (peers, via, pooled) in enumerate(cluster.run(_what_carried_a_ring, 1 << 20)):
        assert peers == [r for r in range(4) if r != rank]
        assert via == {"shm"}
        assert pooled >= size_class((1 << 20) // 4 * 4 // 4)  # 1 MiB messages went into segments
    assert {e.via for e in cluster.trace} == {"shm"}
    grpc = cluster_for("grpc", 2)
    assert [via for _, via, _ in grpc.run(_what_carried_a_ring, 1 << 20)] == [{"grpc"}] * 2


def _held(comm, count):
    """Rank 1 sends several big arrays; rank 0 keeps every one it received, then checks them."""
    if comm.rank == 1:
        for i in range(count):
            comm.send(0, np.full(1 << 18, i, np.float32), "held")  # 1 MiB each
        return None
    kept = [comm.recv(1, "held") for _ in range(count)]
    intact = [bool((a == i).all()) for i, a in enumerate(kept)]
    kept[0][:] = -1  # a received array is the receiver's own, writable
    return intact, sum(link.pool.total for link in comm.nearby.links.values())


@pytest.mark.processes
def test_received_arrays_stay_intact_while_held_and_the_pool_stays_bounded(shm_backend):
    cluster = cluster_for("shm", 2, backend=shm_backend)
    cluster.run(lambda comm: [setattr(link.pool, "limit", 4 << 20) for link in comm.nearby.links.values()])
    try:
        intact, _ = cluster.run(_held, 12)[0]  # 12 MiB held against a 4 MiB pool: the rest goes inline
        assert intact == [True] * 12
        check_allreduce(cluster, "ring", "sum", (1 << 20,), "float32")
    finally:
        cluster.run(lambda comm: [setattr(link.pool, "limit", POOL_BYTES) for link in comm.nearby.links.values()])


@pytest.mark.processes
@needs_linux
def test_linux_segments_are_owner_only_memfds_and_socket_names_unguessable():
    segment = linux.MemfdSegment(1, 1 << 20)
    assert os.fstat(segment.handle).st_mode & 0o777 == 0o600
    assert os.readlink(f"/proc/self/fd/{segment.handle}").startswith("/memfd:allreduce-edu")
    segment.handed_over()
    names = cluster_for("shm", 2, backend="linux").run(lambda comm: comm.shm_socket)
    assert len(set(names)) == 2 and all(len(n.removeprefix("linux:allreduce-edu-")) == 32 for n in names)


@pytest.mark.processes
def test_portable_segments_are_owner_only_unguessable_files_gone_once_mapped():
    ours = portable.Portable()
    segment = ours.new_segment(1, 1 << 20)
    info = os.stat(segment.path)
    assert stat.S_ISREG(info.st_mode) and info.st_mode & 0o777 == 0o600 and info.st_size == 1 << 20
    assert portable.NAMES.fullmatch(segment.handle) and os.path.dirname(segment.path) == portable.scratch_base()
    segment.bytes[:4] = [1, 2, 3, 4]
    theirs = portable.Portable().open_segment(1, 1 << 20, segment.handle)  # the receiver's side
    assert not os.path.exists(segment.path)  # mapped by both: the name is gone, the memory stays
    assert theirs.bytes[:4].tolist() == [1, 2, 3, 4]
    names = cluster_for("shm", 2, backend="portable").run(lambda comm: comm.shm_socket)
    assert len(set(names)) == 2 and all(n.startswith("portable:127.0.0.1:") for n in names)


def test_a_portable_segment_must_be_an_owner_only_file_of_the_size_said(tmp_path):
    receiver = portable.Portable()
    for bad in ("../../etc/passwd", "allreduce-edu-0", None, 7):
        with pytest.raises(ValueError, match="without a name"):
            receiver.open_segment(1, 1 << 20, bad)
    sender = portable.Portable().new_segment(2, 1 << 20)
    with pytest.raises(ValueError, match="not 2097152 owner-only bytes"):
        receiver.open_segment(2, 2 << 20, sender.handle)  # a size it is not
    sender = portable.Portable().new_segment(3, 1 << 20)
    os.chmod(sender.path, 0o644)
    with pytest.raises(ValueError, match="owner-only"):
        receiver.open_segment(3, 1 << 20, sender.handle)
    with pytest.raises(FileNotFoundError):
        receiver.open_segment(4, 1 << 20, portable.Scratch().prefix + "0" * 24)


def test_a_cluster_sweeps_segment_names_its_ranks_left():
    scratch = portable.Scratch()
    left = portable.NamedSegment(1, 1 << 20, scratch.prefix)  # created, never mapped by a peer
    assert os.path.exists(left.path)
    scratch.sweep()
    assert not os.path.exists(left.path)


def test_the_pool_reuses_segments_and_refuses_past_its_limit(shm_backend):
    pool = Pool(shm.chosen()().new_segment, limit=3 << 20)
    first = pool.acquire(5000)
    assert first.handle is not None and first.size == 1 << 20  # new: its handle is still to hand over
    assert pool.acquire(1 << 21) is not None  # 1 + 2 MiB: at the limit
    assert pool.acquire(10) is None  # nothing free, no room: the caller sends inline
    assert pool.release(first.id) and not pool.release(99)
    first.handed_over()  # as a send does: the peer has it now
    again = pool.acquire(10)
    assert again is first and again.handle is None
    pool.close()  # removes only the names of segments never sent
    first.unlink()  # and the peer that never was removes this one's (a portable file)


def _intrude(name: str) -> bytes:
    """Dial a rank's doorbell as a stranger (a wrong token); what it answers."""
    which, _, address = name.partition(":")
    if which == "linux":
        intruder = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        intruder.settimeout(5)
        intruder.connect("\0" + address)
    else:
        host, _, port = address.rpartition(":")
        intruder = socket.create_connection((host, int(port)), 5)
    with intruder:
        intruder.sendall(b"0" * 32 + b" 1\n")
        return intruder.recv(16)


@pytest.mark.processes
def test_a_dialler_without_the_token_is_refused_and_the_cluster_works_on(shm_backend):
    cluster = cluster_for("shm", 2, backend=shm_backend)
    name = cluster.run(lambda comm: comm.shm_socket)[0]
    assert name.startswith(shm_backend + ":")
    assert _intrude(name) == b""  # closed without "ok"
    check_allreduce(cluster, "ring", "sum", (1000,), "float32")


# --- a forged peer: frames from shared memory are checked as the wire's are --------------------
@pytest.fixture
def pair(shm_backend):
    comms = [TRANSPORTS["shm"].communicator(r, 2, token="t" * 32, timeout=5) for r in range(2)]
    addresses = [c.address for c in comms]
    threads = [threading.Thread(target=c.connect, args=(addresses,)) for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert all(c.peers_on_shm() == [1 - c.rank] for c in comms)
    yield comms
    closing = [threading.Thread(target=c.close, kwargs=dict(drain=0.5)) for c in comms]
    for t in closing:  # together, as two rank processes would: neither waits out the other's grace
        t.start()
    for t in closing:
        t.join(10)


def _frame(tag=b"x", shape=(4,), data=b"", signature=b"", **fields) -> bytes:
    """A doorbell frame from raw fields (a float32 array of 4 from rank 1, message 1)."""
    f = dict(version=1, dtype=doorbell.CODES["float32"], ndim=len(shape), flags=0, src=1, step=-1,
             seq=1, epoch=0, collective_id=0, nbytes=16, offset=0, length=len(data), segment=0,
             segment_bytes=0, tag_len=len(tag))
    f.update(fields)
    return (doorbell.FIXED.pack(*f.values()) + struct.pack(f"<{len(shape)}Q", *shape) + tag
            + signature + data)


SEGMENT = dict(segment=1, segment_bytes=1 << 20)


def _forge(comm, frame: list) -> None:
    """Send `frame` as it is, past every check of the sending side."""
    comm.nearby.links[0].channel.send(frame, None, time.monotonic() + 5, lambda: None)


@pytest.mark.parametrize("frame, problem", [
    ([MESSAGE, _frame(dtype=250)], "dtype code 250 in the header is not a wire dtype"),
    ([MESSAGE, _frame(dtype=0)], "dtype 'none' is not allowed"),
    ([MESSAGE, _frame(nbytes=3)], "nbytes=3"),
    ([MESSAGE, _frame(segment=7, segment_bytes=1 << 20)], "unknown segment 7"),
    ([MESSAGE, _frame(segment=7, segment_bytes=8)], "a 16-byte array in a 8-byte segment"),
    ([MESSAGE, _frame(seq=5, **SEGMENT)], "expected message 1"),
    ([MESSAGE, _frame(src=0)], "header says src=0"),
    ([MESSAGE, _frame(step=1 << 21)], "root or step out of range"),
    ([MESSAGE, _frame(data=bytes(16), length=8)], "header says 8 bytes, frame carries 16"),
    ([MESSAGE, _frame(offset=8, length=16, data=bytes(16))], "chunk [8, 24) outside"),
    ([MESSAGE, _frame()[:20]], "a 20-byte frame ends inside its header"),
    ([MESSAGE, _frame(version=9)], "header version 9"),
    ([MESSAGE, _frame(flags=4)], "flags 0x4"),
    ([MESSAGE, _frame(ndim=40, shape=())], "40 dimensions"),
    ([MESSAGE, _frame(ndim=3)], "ends inside its shape"),
    ([MESSAGE, _frame(tag_len=200)], "ends inside its tag"),
    ([MESSAGE, _frame(tag=b"\xff\xfe")], "the tag is not UTF-8"),
    ([MESSAGE, _frame(flags=1)], "ends inside its signature"),
    ([MESSAGE, _frame(flags=1, signature=doorbell.SIGNATURE.pack(-1, 200, 0, 0, 0, 0))],
     "dtype code 200 in the signature"),
    ([MESSAGE, _frame(flags=1, signature=doorbell.SIGNATURE.pack(5, 0, 0, 0, 0, 0))],
     "root or step out of range"),
    ([RELEASE, (3).to_bytes(8, "little")], "a release of a segment this rank never sent"),
    ([b"X", b"junk"], "unknown frame kind"),
])
def test_a_malformed_frame_fails_the_link_with_the_problem_named(pair, frame, problem):
    receiver, forger = pair
    _forge(forger, frame)
    with pytest.raises(ae.RankFailure, match="breaks the contract") as info:
        receiver.recv(1, "x", timeout=5)
    assert problem in str(info.value) and info.value.ranks == (1,)


def test_a_good_forged_inline_frame_is_received(pair):
    receiver, forger = pair
    _forge(forger, [MESSAGE, _frame(dtype=doorbell.CODES["float64"], nbytes=32, data=np.arange(4.0).tobytes())])
    np.testing.assert_array_equal(receiver.recv(1, "x", timeout=5), np.arange(4.0))


def _send_buffers(comm):
    """Rank 1 fills a send buffer and sends it (no copy), drops another unsent; rank 0 checks."""
    from allreduce_edu.comm.transports.shm.segments import Outbox
    if comm.rank == 0:
        return bool((comm.recv(1, "filled") == 5).all())
    link = comm.nearby.links[0]
    copied, segments = link.copied, len(link.pool._all)
    buf = comm.send_buffer(0, (1 << 18,), np.float32)
    buf[:] = 5
    comm.send(0, buf, "filled")
    sent_in_place = Outbox.of(buf).sent and link.copied == copied
    unsent = comm.send_buffer(0, 1 << 18, "float32")
    segment = Outbox.of(unsent).segment
    del unsent  # dropped unsent: its segment is free again
    reused = link.pool.acquire(1 << 20) is segment
    link.pool.release(segment.id)
    small = comm.send_buffer(0, 4, np.float32)  # small messages travel inline: a plain array
    return sent_in_place, reused, Outbox.of(small) is None, len(link.pool._all) - segments


@pytest.mark.processes
def test_a_send_buffer_is_sent_where_it_lies_and_an_unsent_one_goes_back_to_the_pool(shm_backend):
    received, (sent_in_place, reused, small_is_plain, new_segments) = cluster_for(
        "shm", 2, backend=shm_backend).run(_send_buffers)
    assert received and sent_in_place and reused and small_is_plain and new_segments <= 2


def test_send_buffer_on_other_transports_is_an_empty_array():
    shapes = cluster_for("local", 2).run(lambda comm: comm.send_buffer(1 - comm.rank, (3, 2), "int32").shape)
    assert shapes == [(3, 2)] * 2


def _big_chunks_past_the_pool(comm):
    for link in comm.nearby.links.values():
        link.pool.limit = 2 << 20  # a tiny pool: the ring's send buffers cannot all be segments
    try:
        return ae.allreduce(comm, np.full(3 << 20, comm.rank, np.float32), algorithm="ring")[:3].tolist()
    finally:
        for link in comm.nearby.links.values():
            link.pool.limit = POOL_BYTES


@pytest.mark.processes
def test_a_full_pool_gives_plain_send_buffers_and_the_ring_stays_right(shm_backend):
    assert cluster_for("shm", 3, backend=shm_backend).run(_big_chunks_past_the_pool) == [[3.0, 3.0, 3.0]] * 3


def test_a_segment_released_twice_is_refused(shm_backend):
    pool = Pool(shm.chosen()().new_segment)
    segment = pool.acquire(10)
    assert pool.release(segment.id) and not pool.release(segment.id)  # a second release: refused
    pool.close()


@needs_linux
def test_a_received_descriptor_must_be_a_sealed_memfd(tmp_path):
    import fcntl
    plain = os.memfd_create("unsealed", os.MFD_CLOEXEC)
    os.ftruncate(plain, 1 << 20)
    with pytest.raises(ValueError, match="not a sealed memfd"):
        linux.MemfdSegment(1, 1 << 20, plain)  # closes the descriptor it refused
    segment = linux.MemfdSegment(2, 1 << 20)
    assert fcntl.fcntl(segment.handle, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK
    segment.handed_over()


def _both_send_first(comm, count):
    """Each rank sends `count` inline messages to the other before receiving any: far more than a
    socket holds, so each rank's sends must read the other's while they wait for room (the links'
    own threads are kept out of it: a recv a moment ago, and a QUIET longer than the test)."""
    from allreduce_edu.comm.transports.shm import link as shm_link

    peer, quiet = 1 - comm.rank, shm_link.QUIET
    shm_link.QUIET = 1e9
    try:
        comm.barrier()  # a recv on the link: its thread now waits for QUIET
        for i in range(count):
            comm.send(peer, np.full(INLINE_BYTES // 4, i, np.float32), "eager")
        return all((comm.recv(peer, "eager") == i).all() for i in range(count))
    finally:
        shm_link.QUIET = quiet


@pytest.mark.processes
def test_two_eager_senders_to_each_other_never_deadlock(shm_backend):
    assert cluster_for("shm", 2, backend=shm_backend).run(_both_send_first, 40) == [True, True]


def _link_kinds(comm):
    from allreduce_edu.comm.contract import Link
    return sorted({(link.via, isinstance(link, Link)) for link in comm.routes.values()})


@pytest.mark.processes
def test_every_link_a_rank_routes_through_keeps_the_link_contract(shm_backend):
    assert cluster_for("shm", 2, backend=shm_backend).run(_link_kinds) == [[("shm", True)]] * 2
    assert cluster_for("grpc", 2).run(_link_kinds) == [[("grpc", True)]] * 2


def test_a_flood_of_strangers_is_logged_once_and_counted(pair, caplog):
    receiver, _ = pair
    name = receiver.shm_socket
    with caplog.at_level("WARNING", logger="allreduce_edu"):
        for _ in range(30):
            assert _intrude(name) == b""
    deadline = time.monotonic() + 5
    while receiver.nearby.refused < 30 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert receiver.nearby.refused == 30
    assert sum("refused a shared-memory link" in r.getMessage() for r in caplog.records) == 1


def _last_word_then_close(comm):
    """Rank 0 sends 1 MiB (a segment) and closes its links at once; rank 1 reads it a moment later."""
    comm.barrier()
    if comm.rank == 0:
        comm.send(1, np.arange(1 << 18, dtype=np.float32), "last")
        comm.nearby.close()  # what a communicator's close does first
        return True
    with comm.nearby.links[0]._reading:  # busy a moment: the frame waits in the socket
        time.sleep(0.3)
    return bool((comm.recv(0, "last", timeout=5) == np.arange(1 << 18)).all())


@pytest.mark.processes
def test_a_message_sent_just_before_close_still_arrives(shm_backend):
    with ae.Cluster(2, transport="shm", timeout=10) as cluster:
        assert cluster.run(_last_word_then_close) == [True, True]


def test_a_socket_both_waited_on_for_room_and_read_is_seen_readable():
    from allreduce_edu.comm.transports.shm.stream import _ready
    a, b = socket.socketpair()
    with a, b:
        b.sendall(b"x")
        a.setblocking(False)
        while True:  # fill a's send buffer: not writable, but readable
            try:
                a.send(b"\0" * 65536)
            except BlockingIOError:
                break
        t0 = time.monotonic()
        assert _ready(a, a, 2.0) == (True, False) and time.monotonic() - t0 < 1


def test_a_trickling_dialler_holds_the_acceptor_no_longer_than_its_hello_timeout():
    listener = portable.Listener()
    with socket.create_connection(("127.0.0.1", int(listener.address.rpartition(":")[2]))) as slow:
        dialler = listener.accept(5)
        stop = threading.Event()
        threading.Thread(target=lambda: [slow.send(b"0") or stop.wait(0.2) for _ in range(30)
                                         if not stop.is_set()], daemon=True).start()
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            dialler.hello(1.0)
        assert time.monotonic() - t0 < 1.5
        stop.set()
        dialler.close()
    listener.close()


def test_a_sweep_leaves_what_is_not_its_own_and_never_fails(monkeypatch, tmp_path):
    scratch = portable.Scratch()
    folder = os.path.join(portable.scratch_base(), scratch.prefix + "a-folder")
    os.mkdir(folder)  # not a regular file: not ours to remove
    mine = portable.NamedSegment(1, 1 << 20, scratch.prefix)
    try:
        monkeypatch.setattr(portable.os, "unlink", lambda path: (_ for _ in ()).throw(PermissionError(path)))
        scratch.sweep()  # another user's name in a shared folder: refused, and no error for us
        monkeypatch.undo()
        scratch.sweep()
        assert os.path.isdir(folder) and not os.path.exists(mine.path)
    finally:
        os.rmdir(folder)
