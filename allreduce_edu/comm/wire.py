"""Frames on the wire: a protobuf Header plus raw array bytes, written and checked by hand."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from .._proto import rank_pb2 as pb
from .dtypes import DTYPE_OF, WIRE_DTYPES
from .mailbox import Message, Signature

# 1 MiB data frames: well under gRPC's 4 MiB message limit, fastest measured here
CHUNK_BYTES = 1 << 20
MAX_MESSAGE_BYTES = 1 << 31  # the largest array a rank accepts (configurable per communicator)
MAX_DIMS = 32  # as NumPy
# protobuf keys of Frame.header (1, bytes) and Frame.data (2, bytes)
_HEADER_FIELD, _DATA_FIELD = 0x0A, 0x12


class WireError(ValueError):
    """A frame that breaks the contract in rank.proto; the server answers INVALID_ARGUMENT."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise WireError("truncated or overlong varint")
        byte = buf[pos]
        value, pos, shift = value | ((byte & 0x7F) << shift), pos + 1, shift + 7
        if not byte & 0x80:
            return value, pos


def header_of(msg: Message, seq: int) -> pb.Header:
    """The Header that describes `msg` (offset and length still to set)."""
    sig = msg.signature
    header = pb.Header(src=msg.src, tag=msg.tag, seq=seq, epoch=msg.epoch,
                       collective_id=msg.collective_id, step=msg.step, dtype=msg.array.dtype.name,
                       shape=msg.array.shape, nbytes=msg.array.nbytes)
    if sig is not None:
        header.signature.CopyFrom(pb.Signature(collective=sig.collective, algorithm=sig.algorithm,
                                               op=sig.op, dtype=sig.dtype, shape=sig.shape,
                                               root=sig.root))
    return header


def encode_frames(msg: Message, seq: int, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Yield the frames of one message:
    each a valid `Frame`, its data field written without protobuf."""
    header = header_of(msg, seq)
    for offset, data in payload_chunks(msg.array, chunk_bytes):
        header.offset, header.length = offset, len(data)
        head = header.SerializeToString()
        yield b"".join((bytes((_HEADER_FIELD,)), _varint(len(head)), head,
                        bytes((_DATA_FIELD,)), _varint(len(data)), data))


def payload_chunks(array: np.ndarray, chunk_bytes: int) -> Iterator[tuple[int, memoryview]]:
    """(offset, a view of the bytes) for each chunk of `array`: at least one, empty for 0 bytes."""
    payload = memoryview(array.reshape(-1)).cast("B")
    offset = 0
    while True:
        data = payload[offset:offset + chunk_bytes]
        yield offset, data
        offset += len(data)
        if offset >= len(payload):
            return


def decode_frame(frame: bytes) -> tuple[pb.Header, memoryview]:
    """Split a frame into its parsed Header and a zero-copy view of its data;
    raise WireError if malformed."""
    buf, pos = memoryview(frame), 0
    header, data = None, memoryview(b"")
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        if key not in (_HEADER_FIELD, _DATA_FIELD):
            raise WireError(f"unexpected field key {key} in Frame")
        size, pos = _read_varint(buf, pos)
        if pos + size > len(buf):
            raise WireError("field runs past the end of the frame")
        if key == _HEADER_FIELD:
            header = pb.Header()
            try:
                header.ParseFromString(buf[pos:pos + size])
            except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
                raise WireError(f"unparseable header: {e}") from None
        else:
            data = buf[pos:pos + size]
        pos += size
    if header is None:
        raise WireError("frame has no header")
    return header, data


def check_header(h, world_size: int, src: int, max_bytes: int = MAX_MESSAGE_BYTES) -> None:
    """Validate a header (protobuf, or the doorbell's Head) before anything is allocated for it;
    raise WireError naming the problem."""
    if h.src != src:
        raise WireError(f"header says src={h.src} on rank {src}'s stream")
    if h.dtype not in WIRE_DTYPES:
        raise WireError(f"dtype {h.dtype!r} is not allowed on the wire")
    shape = h.shape
    if len(shape) > MAX_DIMS or (shape and (min(shape) < 0 or max(shape) > max_bytes)):
        raise WireError(f"bad shape {tuple(h.shape)}")
    expected = DTYPE_OF[h.dtype].itemsize * math.prod(h.shape)
    if h.nbytes != expected or expected > max_bytes:
        raise WireError(f"nbytes={h.nbytes} for {h.dtype}{tuple(h.shape)} (expected {expected}, "
                        f"limit {max_bytes})")
    if h.segment and h.segment_bytes < h.nbytes:
        raise WireError(f"a {h.nbytes}-byte array in a {h.segment_bytes}-byte segment")
    if h.offset + h.length > h.nbytes:
        raise WireError(f"chunk [{h.offset}, {h.offset + h.length}) outside a "
                        f"{h.nbytes}-byte array")
    sig = h.signature  # protobuf: always there (empty: defaults); a doorbell Head: None or whole
    if sig is not None and sig.dtype and sig.dtype not in WIRE_DTYPES:
        raise WireError(f"signature dtype {sig.dtype!r} is not allowed")
    if (sig is not None and not -1 <= sig.root < world_size) or not -1 <= h.step < 1 << 20:
        raise WireError("root or step out of range")


def to_message(h, array: np.ndarray) -> Message:
    """The Message a complete array and its header (protobuf, or the doorbell's Head) make."""
    signature = h.signature
    if isinstance(h, pb.Header):
        s = signature
        signature = Signature(s.collective, s.algorithm, s.op, s.dtype, tuple(s.shape), s.root) \
            if h.HasField("signature") else None
    return Message(h.src, h.tag, array, h.epoch, h.collective_id, signature, h.step)


class Assembler:
    """Frames from one peer's stream, checked and put back together:
    `add` returns each complete Message.

    Messages arrive whole and in order (seq 1, 2, ...), each as chunks at increasing offsets;
    anything else raises WireError before a byte of it is stored.
    Every header is checked before allocation.
    """

    def __init__(self, rank: int, world_size: int, src: int, max_bytes: int = MAX_MESSAGE_BYTES):
        self.rank, self.world_size, self.src, self.max_bytes = rank, world_size, src, max_bytes
        self.messages = 0  # complete messages so far (the last seq)
        self._header, self._flat, self._array, self._received = None, None, None, 0

    def add(self, frame: bytes) -> Message | None:
        return self.add_decoded(*decode_frame(frame))

    def add_decoded(self, h, data: memoryview) -> Message | None:
        check_header(h, self.world_size, self.src, self.max_bytes)
        if h.length != len(data):
            raise WireError(f"header says {h.length} bytes, frame carries {len(data)}")
        if h.segment:
            raise WireError("a shared-memory frame on a stream that has no shared memory")
        if self._header is None:  # first chunk of a new message
            if h.seq != self.messages + 1 or h.offset != 0:
                raise WireError(f"expected message {self.messages + 1} from offset 0, "
                                f"got {h.seq} at {h.offset}")
            if h.length == h.nbytes:  # whole in this one frame: one copy, nothing to assemble
                self.messages = h.seq
                array = np.frombuffer(data, DTYPE_OF[h.dtype]).copy()
                return to_message(h, array if len(h.shape) == 1 else array.reshape(h.shape))
            self._header, self._received = h, 0
            self._array = np.empty(tuple(h.shape), DTYPE_OF[h.dtype])
            self._flat = self._array.reshape(-1).view(np.uint8)
        elif (h.seq, h.offset, h.nbytes) != (self._header.seq, self._received, self._header.nbytes):
            raise WireError(f"chunk of message {h.seq} at {h.offset} does not continue "
                            f"message {self._header.seq} at {self._received}")
        self._flat[self._received:self._received + h.length] = np.frombuffer(data, np.uint8)
        self._received += h.length
        if self._received < self._header.nbytes:
            return None
        message = to_message(self._header, self._array)
        self.messages, self._header, self._flat, self._array = self._header.seq, None, None, None
        return message

    def take_seq(self, h) -> None:
        """Count a whole message that came another way (the shm transport's segments),
        checking it is the next one and none is half assembled."""
        if self._header is not None or h.seq != self.messages + 1:
            raise WireError(f"expected message {self.messages + 1}"
                            f"{' to continue' if self._header is not None else ''}, got {h.seq}")
        self.messages = h.seq
