"""The wire contract: committed stubs match the .proto, frames are valid protobuf, strangers are refused."""

from __future__ import annotations

import filecmp
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import cluster_for, needs_proc

from allreduce_edu._proto import codegen
from allreduce_edu._proto import rank_pb2 as pb
from allreduce_edu.comm.auth import TOKEN_KEY
from allreduce_edu.comm.mailbox import Message, Signature
from allreduce_edu.comm.transports.grpc.communicator import EXCHANGE, SERVICE, GrpcCommunicator
from allreduce_edu.comm.wire import WireError, check_header, decode_frame, encode_frames


def test_committed_stubs_match_a_fresh_codegen(tmp_path):
    for fresh in codegen.generate(tmp_path):
        committed = codegen.ROOT / fresh.relative_to(tmp_path)
        assert filecmp.cmp(fresh, committed, shallow=False), \
            f"{committed} is stale: run `python -m allreduce_edu._proto.codegen` and commit the result"


def _message(array, tag="reduce_scatter"):
    return Message(2, tag, array, epoch=3, collective_id=1, step=4,
                   signature=Signature("allreduce", "ring", "sum", "float32", (5, 7)))


def test_hand_written_frames_are_valid_protobuf():
    array = np.arange(35, dtype=np.float32).reshape(5, 7)
    frames = list(encode_frames(_message(array), seq=9, chunk_bytes=64))
    assert len(frames) == 3  # 140 bytes in 64-byte chunks
    data = b""
    for frame in frames:
        parsed = pb.Frame.FromString(frame)  # protobuf's own parser agrees with ours
        header, view = decode_frame(frame)
        assert parsed.header == header and parsed.data == bytes(view)
        assert (header.src, header.tag, header.seq, header.step) == (2, "reduce_scatter", 9, 4)
        assert header.signature.algorithm == "ring" and tuple(header.signature.shape) == (5, 7)
        check_header(header, world_size=4, src=2)
        data += parsed.data
    assert np.array_equal(np.frombuffer(data, np.float32).reshape(5, 7), array)


def _header(**changes) -> pb.Header:
    frame = next(encode_frames(_message(np.zeros(4, np.float64)), seq=1))
    header, _ = decode_frame(frame)
    for key, value in changes.items():
        if key == "shape":
            del header.shape[:]
            header.shape.extend(value)
        else:
            setattr(header, key, value)
    return header


@pytest.mark.parametrize("changes, words", [
    ({"src": 1}, "src=1"),
    ({"dtype": "object"}, "'object' is not allowed"),
    ({"nbytes": 31}, "nbytes=31"),
    ({"shape": [1 << 29], "nbytes": 8 << 29}, "limit"),
    ({"shape": [1 << 40], "nbytes": 8 << 40}, "bad shape"),
    ({"shape": [1 << 62, 1 << 62, 0], "nbytes": 0}, "bad shape"),  # empty, yet too big for np.empty
    ({"shape": [-1], "nbytes": 8}, "bad shape"),
    ({"offset": 30, "length": 8}, "outside"),
    ({"step": 1 << 30}, "out of range"),
])
def test_bad_headers_are_refused_before_allocation(changes, words):
    with pytest.raises(WireError, match=words):
        check_header(_header(**changes), world_size=4, src=2)


@pytest.mark.parametrize("frame", [b"", b"\x0a", b"\x0a\x05ab", b"\x12\x01x", b"\x1a\x00", b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"])
def test_malformed_frames_raise_wire_error(frame):
    with pytest.raises(WireError):
        decode_frame(frame)


@pytest.fixture(scope="module")
def server():
    comm = GrpcCommunicator(0, 2, token="the-right-token", timeout=5)
    yield comm
    comm.close()


CALL_KINDS = {"unary_unary": lambda ch, path: ch.unary_unary(path)(b"", timeout=5, metadata=META),
              "unary_stream": lambda ch, path: list(ch.unary_stream(path)(b"", timeout=5, metadata=META)),
              "stream_unary": lambda ch, path: ch.stream_unary(path)(iter([b""]), timeout=5, metadata=META),
              "stream_stream": lambda ch, path: list(ch.stream_stream(path)(iter([b""]), timeout=5, metadata=META))}
META = ()


@pytest.mark.parametrize("path", [f"/{SERVICE}/Ping", EXCHANGE, f"/{SERVICE}/Undeclared", "/other.Service/Call"])
@pytest.mark.parametrize("kind", CALL_KINDS)
@pytest.mark.parametrize("token", [None, "a-wrong-token", ""])
def test_calls_without_the_token_are_unauthenticated(server, path, kind, token):
    global META
    META = () if token is None else ((TOKEN_KEY, token),)
    with grpc.insecure_channel(server.address, options=[("grpc.enable_http_proxy", 0)]) as channel:
        with pytest.raises(grpc.RpcError) as info:
            CALL_KINDS[kind](channel, path)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, info.value


def test_the_token_opens_the_door(server):
    with grpc.insecure_channel(server.address, options=[("grpc.enable_http_proxy", 0)]) as channel:
        reply = channel.unary_unary(f"/{SERVICE}/Ping", pb.PingRequest.SerializeToString, pb.PingReply.FromString)(
            pb.PingRequest(src=1), metadata=((TOKEN_KEY, "the-right-token"),), timeout=5)
    assert (reply.rank, reply.world_size) == (0, 2)


def _listening_hosts(port: int) -> set[str]:
    hosts = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if int(hex_port, 16) == port and state == "0A":  # 0A = LISTEN
                hosts.add(address)
    return hosts


@pytest.mark.processes
@needs_proc
def test_ranks_listen_on_loopback_only():
    cluster = cluster_for("grpc", 3)
    for address in cluster.addresses:
        host, port = address.rsplit(":", 1)
        assert host == "127.0.0.1"
        hosts = _listening_hosts(int(port))
        # 127.0.0.1 as /proc writes it, in IPv4 or IPv4-mapped IPv6 form; never 0.0.0.0 or ::
        assert hosts and hosts <= {"0100007F", "0000000000000000FFFF00000100007F"}, hosts


def test_assembler_puts_chunked_messages_back_together_without_grpc():
    from allreduce_edu.comm.mailbox import Message
    from allreduce_edu.comm.wire import Assembler

    array = np.arange(1000, dtype=np.float32).reshape(10, 100)
    assembler = Assembler(rank=1, world_size=2, src=0)
    for seq in (1, 2):
        frames = list(encode_frames(Message(0, "t", array, step=seq), seq, chunk_bytes=1024))
        assert len(frames) == 4
        got = [assembler.add(f) for f in frames]
        assert got[:3] == [None] * 3 and np.array_equal(got[3].array, array) and got[3].step == seq
    assert assembler.messages == 2


@pytest.mark.parametrize("problem", ["skip", "reorder", "other src"])
def test_assembler_refuses_frames_out_of_order(problem):
    from allreduce_edu.comm.mailbox import Message
    from allreduce_edu.comm.wire import Assembler

    array = np.zeros(600, np.uint8)
    frames = list(encode_frames(Message(0, "t", array), 1, chunk_bytes=256))
    assembler = Assembler(rank=1, world_size=3, src=2 if problem == "other src" else 0)
    sequence = {"skip": [frames[0], frames[2]], "reorder": [frames[1]], "other src": [frames[0]]}[problem]
    with pytest.raises(WireError):
        for frame in sequence:
            assembler.add(frame)
