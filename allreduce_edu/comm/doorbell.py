"""The shared-memory link's frame header: fixed binary fields, packed and checked by hand.

    head = pack(msg, seq, offset, length)              # bytes; the data follows it in the frame
    h, data = unpack(frame)                            # a Head and a view of the data, or WireError

The gRPC stream carries rank.proto's protobuf Header; between two ranks on one machine the doorbell
socket carries the same fields in a fixed layout instead (struct: one call to pack, one to
unpack; protobuf's build, serialise and parse cost ~15 µs a message here, more than the socket).
Every field is read before anything is allocated, and wire.check_header then applies the same
rules to a Head as to a protobuf Header (sizes, dtype, shape bounds, src, step, root).

Layout, little-endian: FIXED (version, dtype, ndim, flags, src, step, seq, epoch, collective_id,
nbytes, offset, length, segment, segment_bytes, tag length), the shape (ndim × u64), the tag
(UTF-8); if flags says so, SIGNATURE (root, dtype, ndim, three string lengths), its shape and its
collective, algorithm and op names. Then the data.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .base import WIRE_DTYPES
from .mailbox import Message, Signature
from .wire import MAX_DIMS, WireError

VERSION = 1
FIXED = struct.Struct("<BBBBiiQQQQQQQQH")
SIGNATURE = struct.Struct("<iBBBBB")
DTYPES = ("",) + tuple(sorted(WIRE_DTYPES))  # code -> dtype name; 0: none
CODES = {name: code for code, name in enumerate(DTYPES)}
HAS_SIGNATURE = 1


@dataclass(slots=True)
class Head:
    """A frame's header, field for field rank.proto's Header (a signature is None or whole)."""

    src: int
    tag: str
    seq: int
    epoch: int
    collective_id: int
    step: int
    dtype: str
    shape: tuple
    nbytes: int
    offset: int = 0
    length: int = 0
    segment: int = 0
    segment_bytes: int = 0
    signature: Signature | None = None


def pack(msg: Message, seq: int, offset: int = 0, length: int = 0, segment: int = 0,
         segment_bytes: int = 0) -> bytes:
    """The header bytes of one frame of `msg`."""
    array, sig = msg.array, msg.signature
    tag = msg.tag.encode()
    parts = [FIXED.pack(VERSION, CODES[array.dtype.name], array.ndim,
                        HAS_SIGNATURE if sig is not None else 0, msg.src, msg.step, seq,
                        msg.epoch, msg.collective_id, array.nbytes, offset, length, segment,
                        segment_bytes, len(tag)),
             struct.pack(f"<{array.ndim}Q", *array.shape), tag]
    if sig is not None:
        names = [sig.collective.encode(), sig.algorithm.encode(), sig.op.encode()]
        parts += [SIGNATURE.pack(sig.root, CODES.get(sig.dtype, 255), len(sig.shape),
                                 *map(len, names)),
                  struct.pack(f"<{len(sig.shape)}Q", *sig.shape), *names]
    return b"".join(parts)


def frames(msg: Message, seq: int, chunk_bytes: int):
    """[header, data] for each frame of an inline message (sendmsg gathers them: no join)."""
    payload = memoryview(msg.array.reshape(-1)).cast("B")
    offset = 0
    while True:
        data = payload[offset:offset + chunk_bytes]
        yield [pack(msg, seq, offset, len(data)), data]
        offset += len(data)
        if offset >= len(payload):
            return


class _Reader:
    """Reads fields off a frame, each one checked to lie inside it."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: memoryview):
        self.buf, self.pos = buf, 0

    def take(self, layout: struct.Struct | str, what: str):
        size = layout.size if isinstance(layout, struct.Struct) else struct.calcsize(layout)
        if self.pos + size > len(self.buf):
            raise WireError(f"a {len(self.buf)}-byte frame ends inside its {what}")
        values = (layout.unpack_from(self.buf, self.pos) if isinstance(layout, struct.Struct)
                  else struct.unpack_from(layout, self.buf, self.pos))  # formats are cached
        self.pos += size
        return values

    def text(self, size: int, what: str) -> str:
        if self.pos + size > len(self.buf):
            raise WireError(f"a {len(self.buf)}-byte frame ends inside its {what}")
        raw, self.pos = bytes(self.buf[self.pos:self.pos + size]), self.pos + size
        try:
            return raw.decode()
        except UnicodeDecodeError:
            raise WireError(f"the {what} is not UTF-8") from None


def _dtype(code: int, what: str) -> str:
    if code >= len(DTYPES):
        raise WireError(f"dtype code {code} in the {what} is not a wire dtype")
    return DTYPES[code]


def unpack(frame) -> tuple[Head, memoryview]:
    """A frame's Head and a zero-copy view of its data; WireError if it cannot be read."""
    r = _Reader(memoryview(frame))
    (version, code, ndim, flags, src, step, seq, epoch, collective_id, nbytes, offset, length,
     segment, segment_bytes, tag_len) = r.take(FIXED, "header")
    if version != VERSION:
        raise WireError(f"header version {version} (this rank reads {VERSION})")
    if ndim > MAX_DIMS or flags & ~HAS_SIGNATURE:
        raise WireError(f"bad header: {ndim} dimensions, flags {flags:#x}")
    shape = r.take(f"<{ndim}Q", "shape")
    h = Head(src, r.text(tag_len, "tag"), seq, epoch, collective_id, step,
             _dtype(code, "header") or "none", shape, nbytes, offset, length, segment,
             segment_bytes)
    if flags & HAS_SIGNATURE:
        root, sig_code, sig_ndim, *lengths = r.take(SIGNATURE, "signature")
        if sig_ndim > MAX_DIMS:
            raise WireError(f"bad signature: {sig_ndim} dimensions")
        sig_shape = r.take(f"<{sig_ndim}Q", "signature")
        names = [r.text(size, "signature") for size in lengths]
        h.signature = Signature(names[0], names[1], names[2], _dtype(sig_code, "signature"),
                                sig_shape, root)
    return h, r.buf[r.pos:]
