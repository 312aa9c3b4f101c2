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

import functools
import struct
from dataclasses import dataclass

from ...dtypes import WIRE_DTYPES, wire_name
from ...mailbox import Message, Signature
from ...wire import MAX_DIMS, WireError, payload_chunks

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
    tag = _encoded(msg.tag)
    return b"".join((FIXED.pack(VERSION, CODES[wire_name(array.dtype)], array.ndim,
                                HAS_SIGNATURE if sig is not None else 0, msg.src, msg.step, seq,
                                msg.epoch, msg.collective_id, array.nbytes, offset, length,
                                segment, segment_bytes, len(tag)),
                     _dims(array.ndim).pack(*array.shape), tag,
                     b"" if sig is None else _signature_bytes(sig)))


@functools.lru_cache(maxsize=256)
def _encoded(text: str) -> bytes:
    return text.encode()


DIMS = tuple(struct.Struct(f"<{ndim}Q") for ndim in range(MAX_DIMS + 1))  # made once, not per frame


def _dims(ndim: int) -> struct.Struct:
    """The layout of an `ndim`-long shape (more than MAX_DIMS: made, and refused by the reader)."""
    return DIMS[ndim] if ndim <= MAX_DIMS else struct.Struct(f"<{ndim}Q")


@functools.lru_cache(maxsize=256)
def _signature_bytes(sig: Signature) -> bytes:
    """A collective's signature, packed once: every message of the collective carries it."""
    names = [sig.collective.encode(), sig.algorithm.encode(), sig.op.encode()]
    return b"".join((SIGNATURE.pack(sig.root, CODES.get(sig.dtype, 255), len(sig.shape),
                                    *map(len, names)), _dims(len(sig.shape)).pack(*sig.shape),
                     *names))


def frames(msg: Message, seq: int, chunk_bytes: int):
    """[header, data] for each frame of an inline message (sendmsg gathers them: no join)."""
    for offset, data in payload_chunks(msg.array, chunk_bytes):
        yield [pack(msg, seq, offset, len(data)), data]


def _short(frame, what: str) -> WireError:
    return WireError(f"a {len(frame)}-byte frame ends inside its {what}")


def _dtype(code: int, what: str) -> str:
    if code >= len(DTYPES):
        raise WireError(f"dtype code {code} in the {what} is not a wire dtype")
    return DTYPES[code]


def _text(raw, what: str) -> str:
    try:
        return str(raw, "utf-8")  # bytes, or a view of the frame (no copy first)
    except UnicodeDecodeError:
        raise WireError(f"the {what} is not UTF-8") from None


@functools.lru_cache(maxsize=256)
def _signature(raw: bytes) -> Signature:
    """A packed signature read back (whole: the caller cut it to its lengths)."""
    root, code, ndim, *lengths = SIGNATURE.unpack_from(raw)
    if ndim > MAX_DIMS:
        raise WireError(f"bad signature: {ndim} dimensions")
    pos = SIGNATURE.size + 8 * ndim
    shape = _dims(ndim).unpack_from(raw, SIGNATURE.size)
    names = []
    for size in lengths:
        names.append(_text(raw[pos:pos + size], "signature"))
        pos += size
    return Signature(names[0], names[1], names[2], _dtype(code, "signature"), shape, root)


def unpack(frame) -> tuple[Head, memoryview]:
    """A frame's Head and a zero-copy view of its data; WireError if it cannot be read."""
    buf = memoryview(frame)
    if len(buf) < FIXED.size:
        raise _short(buf, "header")
    (version, code, ndim, flags, src, step, seq, epoch, collective_id, nbytes, offset, length,
     segment, segment_bytes, tag_len) = FIXED.unpack_from(buf)
    if version != VERSION:
        raise WireError(f"header version {version} (this rank reads {VERSION})")
    if ndim > MAX_DIMS or flags & ~HAS_SIGNATURE:
        raise WireError(f"bad header: {ndim} dimensions, flags {flags:#x}")
    pos = FIXED.size + 8 * ndim
    if pos > len(buf):
        raise _short(buf, "shape")
    if pos + tag_len > len(buf):
        raise _short(buf, "tag")
    h = Head(src, _text(buf[pos:pos + tag_len], "tag"), seq, epoch, collective_id, step,
             _dtype(code, "header") or "none", DIMS[ndim].unpack_from(buf, FIXED.size), nbytes,
             offset, length, segment, segment_bytes)
    pos += tag_len
    if flags & HAS_SIGNATURE:
        if pos + SIGNATURE.size > len(buf):
            raise _short(buf, "signature")
        _, _, sig_ndim, *lengths = SIGNATURE.unpack_from(buf, pos)
        end = pos + SIGNATURE.size + 8 * min(sig_ndim, MAX_DIMS + 1) + sum(lengths)
        if end > len(buf):
            raise _short(buf, "signature")
        h.signature, pos = _signature(bytes(buf[pos:end])), end
    return h, buf[pos:]
