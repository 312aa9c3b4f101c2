"""What a frame on a shared-memory link's socket is, by its first byte, and what its receiver does
with it (link.py reads the frames; this handles one): a message's header (doorbell.py) with its
data inline or in a segment (segments.py), "done with segment n", a doorbell, the peer's ring
(eager.py), the peer's symmetric window (window.py)."""

from __future__ import annotations

from ...wire import WireError, to_message
from .doorbell import unpack
from .eager import DOORBELL, RING, map_ring, ring_one
from .segments import lease
from .window import KIND as WINDOW
from .window import take as take_window

MESSAGE, RELEASE = b"M", b"R"  # a message; "done with segment n" (8 bytes, little-endian)


def take(link, data: bytes, handle) -> None:
    """Handle one frame of `link`'s peer; its segment handle, if any, is used or discarded here."""
    try:
        kind, body = data[:1], memoryview(data)[1:]
        if kind == RELEASE:
            if (handle is not None or len(body) != 8
                    or not link.pool.release(int.from_bytes(body, "little"))):
                raise WireError("a release of a segment this rank never sent")
            return
        if kind == DOORBELL and handle is None and not body:
            return  # it woke us: the link's _read_one reads the ring
        if kind == RING:
            given, handle = handle, None
            return map_ring(link, body, given)
        if kind == WINDOW:
            given, handle = handle, None
            return take_window(link, body, given)
        if kind != MESSAGE:
            raise WireError(f"unknown frame kind {kind!r}")
        h, payload = unpack(body)
        while link.assembler.messages + 1 < h.seq and ring_one(link):
            pass  # messages before this one that went through the ring come first
        if not h.segment:
            if handle is not None:
                raise WireError("a segment handle with an inline frame")
            message = link.assembler.add_decoded(h, payload)
        else:
            given, handle = handle, None  # lease uses it up
            message = to_message(h, lease(link, h, given))
    finally:
        if handle is not None:
            link.backend.discard(handle)
    if message is not None:
        link.comm.deliver(message)
