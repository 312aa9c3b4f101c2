"""The rank server is a network service: loopback by default, token always, TLS for several machines,
and hostile frames from a caller that has the token are refused without harm."""

from __future__ import annotations

import datetime
import ipaddress
import time

import grpc
import numpy as np
import pytest
from conftest import cluster_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import allreduce_edu as ae
from allreduce_edu.comm.auth import RANK_KEY, TLS, TOKEN_KEY
from allreduce_edu.comm.mailbox import Message, Signature
from allreduce_edu.comm.transports.grpc.communicator import EXCHANGE, GrpcCommunicator
from allreduce_edu.comm.wire import encode_frames

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402


def self_signed(common_name: str = "allreduce-edu test cluster") -> TLS:
    """A certificate for 127.0.0.1 made in the test: its own CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return TLS(cert=cert.public_bytes(serialization.Encoding.PEM),
               key=key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()))


def _sum(comm):
    return ae.allreduce(comm, np.arange(5.0) * (comm.rank + 1), algorithm="ring")


@pytest.mark.processes
@pytest.mark.parametrize("mutual", [False, True])
def test_tls_cluster_computes_over_encrypted_links(mutual):
    tls = self_signed()
    with ae.Cluster(3, tls=TLS(tls.cert, tls.key, mutual=mutual)) as cluster:
        results = cluster.run(_sum)
    assert all(np.array_equal(r, np.arange(5.0) * 6) for r in results)


def test_a_plaintext_client_cannot_talk_to_a_tls_rank():
    server = GrpcCommunicator(0, 2, token="t", timeout=5, tls=self_signed())
    try:
        with grpc.insecure_channel(server.address) as channel, pytest.raises(grpc.RpcError) as info:
            channel.unary_unary("/allreduce_edu.Rank/Ping")(b"", metadata=((TOKEN_KEY, "t"),), timeout=3)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.close()


def test_mutual_tls_refuses_a_client_without_a_certificate():
    tls = self_signed()
    server = GrpcCommunicator(0, 2, token="t", timeout=5, tls=TLS(tls.cert, tls.key, mutual=True))
    try:
        credentials = grpc.ssl_channel_credentials(root_certificates=tls.cert)  # trusts the server, shows no cert
        with grpc.secure_channel(server.address, credentials) as channel, pytest.raises(grpc.RpcError) as info:
            channel.unary_unary("/allreduce_edu.Rank/Ping")(b"", metadata=((TOKEN_KEY, "t"),), timeout=3)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.close()


@pytest.mark.processes
def test_the_default_bind_address_is_loopback():
    import inspect
    assert inspect.signature(ae.Cluster).parameters["host"].default == "127.0.0.1"
    assert GrpcCommunicator.__init__.__kwdefaults__["host"] == "127.0.0.1"
    assert all(a.startswith("127.0.0.1:") for a in cluster_for("grpc", 2).addresses)


def test_a_rank_needs_a_token():
    with pytest.raises(ValueError, match="token"):
        GrpcCommunicator(0, 2, token="")


# --- hostile frames from a caller that holds the token --------------------------------------
@pytest.fixture(scope="module")
def target():
    """A lone rank 0 of a world of 2; the test plays rank 1 with the right token."""
    comm = GrpcCommunicator(0, 2, token="fuzz-token", timeout=5, max_message_bytes=1 << 20)
    yield comm
    comm.close()


def _send_frames(comm: GrpcCommunicator, frames: list[bytes], src: str = "1") -> grpc.StatusCode:
    with grpc.insecure_channel(comm.address, options=[("grpc.enable_http_proxy", 0)]) as channel:
        try:
            channel.stream_unary(EXCHANGE)(iter(frames), metadata=((TOKEN_KEY, "fuzz-token"), (RANK_KEY, src)),
                                           timeout=5)
            return grpc.StatusCode.OK
        except grpc.RpcError as e:
            return e.code()


def _valid_frames(array: np.ndarray, seq: int = 1, chunk_bytes: int = 1 << 20, tag: str = "probe") -> list[bytes]:
    msg = Message(1, tag, array, epoch=0, collective_id=0,
                  signature=Signature("allreduce", "ring", "sum", array.dtype.name, array.shape))
    return list(encode_frames(msg, seq, chunk_bytes))


def _still_healthy(comm: GrpcCommunicator) -> None:
    """The rank survived: a fresh, honest message still arrives whole and correct."""
    array = np.arange(10, dtype=np.int64)
    assert _send_frames(comm, _valid_frames(array, tag="health")) == grpc.StatusCode.OK
    received = comm.recv(1, "health", timeout=5)
    assert np.array_equal(received, array)


@pytest.mark.parametrize("frames, why", [
    ([b"\x00garbage"], "unknown field"),
    (_valid_frames(np.zeros(4), seq=2), "sequence number out of order"),
    (_valid_frames(np.zeros(1 << 18, np.float64)), "over the rank's 1 MiB max_message_bytes"),
    ([f[:-3] for f in _valid_frames(np.zeros(100))], "truncated data"),
    (_valid_frames(np.zeros(100), chunk_bytes=256)[:1] + _valid_frames(np.zeros(100), chunk_bytes=256)[:1],
     "chunk repeated instead of continued"),
])
def test_malformed_messages_are_invalid_argument_and_harmless(target, frames, why):
    assert _send_frames(target, frames) == grpc.StatusCode.INVALID_ARGUMENT, why
    _still_healthy(target)


@pytest.mark.parametrize("src", ["0", "2", "-1", "x", ""])
def test_a_stream_claiming_a_bad_rank_is_refused(target, src):
    assert _send_frames(target, _valid_frames(np.zeros(3)), src=src) == grpc.StatusCode.INVALID_ARGUMENT
    _still_healthy(target)


def _mutate(frame: bytes, data) -> bytes:
    """Flip, cut or splice bytes of a valid frame."""
    kind = data.draw(st.sampled_from(["flip", "cut", "splice", "random"]))
    raw = bytearray(frame)
    if kind == "flip" and raw:
        for _ in range(data.draw(st.integers(1, 8))):
            raw[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    elif kind == "cut":
        raw = raw[:data.draw(st.integers(0, len(raw)))]
    elif kind == "splice":
        at = data.draw(st.integers(0, len(raw)))
        raw[at:at] = data.draw(st.binary(max_size=64))
    else:
        raw = bytearray(data.draw(st.binary(max_size=256)))
    return bytes(raw)


@pytest.mark.slow
@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          database=None)
@given(data=st.data())
def test_fuzz_random_and_mutated_frames_never_hurt_a_rank(target, data):
    array = np.arange(data.draw(st.integers(0, 64)), dtype=data.draw(st.sampled_from(["float32", "int64", "uint8"])))
    frames = _valid_frames(array, chunk_bytes=data.draw(st.sampled_from([8, 64, 1 << 20])))
    frames = [_mutate(f, data) if data.draw(st.booleans()) else f for f in frames]
    code = _send_frames(target, frames)
    assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT), code
    _still_healthy(target)  # whatever a lucky mutation delivered waits under its own tag


@pytest.mark.slow
def test_after_the_fuzz_a_whole_cluster_still_computes():
    cluster = cluster_for("grpc", 3)
    t0 = time.monotonic()
    for _ in range(50):  # a bounded burst of strangers against every rank, then real work
        for address in cluster.addresses:
            with grpc.insecure_channel(address) as channel:
                with pytest.raises(grpc.RpcError):
                    channel.stream_unary(EXCHANGE)(iter([b"\x0a\x02zz"]), timeout=2)
    assert time.monotonic() - t0 < 60
    assert all(np.array_equal(r, np.arange(5.0) * 6) for r in cluster.run(_sum))
