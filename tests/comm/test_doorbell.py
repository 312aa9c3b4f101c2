"""The doorbell's binary header: what pack writes, unpack reads back field for field; a frame cut
short anywhere, or with any byte changed, is a WireError or a header check_header then judges,
never another exception."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allreduce_edu.comm.base import WIRE_DTYPES
from allreduce_edu.comm.mailbox import Message, Signature
from allreduce_edu.comm.transports.shm import doorbell
from allreduce_edu.comm.wire import WireError, check_header, to_message

names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
signatures = st.none() | st.builds(
    Signature, names, names, names, st.sampled_from(["", *sorted(WIRE_DTYPES)]),
    st.lists(st.integers(0, 2**40), max_size=4).map(tuple), st.integers(-1, 7))


@st.composite
def messages(draw):
    shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
    array = np.zeros(shape, draw(st.sampled_from(sorted(WIRE_DTYPES))))
    return Message(draw(st.integers(0, 7)), draw(names), array, draw(st.integers(0, 2**40)),
                   draw(st.integers(0, 2**40)), draw(signatures), draw(st.integers(-1, 2**20 - 1)))


@settings(max_examples=200, deadline=None)
@given(messages(), st.integers(1, 2**62), st.integers(0, 2**40), st.integers(0, 2**40))
def test_unpack_reads_back_what_pack_wrote(msg, seq, segment, segment_bytes):
    data = msg.array.tobytes()
    frame = doorbell.pack(msg, seq, 0, len(data), segment, segment_bytes) + data
    h, payload = doorbell.unpack(frame)
    assert bytes(payload) == data
    assert (h.src, h.tag, h.seq, h.epoch, h.collective_id, h.step, h.dtype, h.shape, h.nbytes,
            h.length, h.segment, h.segment_bytes) == (
        msg.src, msg.tag, seq, msg.epoch, msg.collective_id, msg.step, msg.array.dtype.name,
        msg.array.shape, msg.array.nbytes, len(data), segment, segment_bytes)
    assert h.signature == msg.signature
    back = to_message(h, msg.array)
    assert (back.tag, back.signature, back.step, back.epoch) == (msg.tag, msg.signature, msg.step,
                                                                 msg.epoch)


def _valid_frame() -> bytes:
    sig = Signature("allreduce", "ring", "sum", "float32", (3, 4), -1)
    msg = Message(1, "reduce_scatter", np.arange(12, dtype=np.float32).reshape(3, 4), 2, 9, sig, 3)
    return doorbell.pack(msg, 1, 0, 48) + msg.array.tobytes()


def test_a_frame_cut_short_anywhere_is_a_wire_error():
    frame = _valid_frame()
    for end in range(len(frame) - 48):  # every cut inside the header
        with pytest.raises(WireError):
            doorbell.unpack(frame[:end])


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_changed_byte_is_refused_or_checked(data):
    frame = bytearray(_valid_frame())
    where = data.draw(st.integers(0, len(frame) - 49))
    frame[where] = data.draw(st.integers(0, 255))
    try:
        h, payload = doorbell.unpack(bytes(frame))
        check_header(h, 4, 1)
    except WireError:
        return  # refused, with the problem named
    assert h.nbytes == np.dtype(h.dtype).itemsize * int(np.prod(h.shape))  # else checked out


def test_a_signature_dtype_the_wire_cannot_name_is_refused_when_packed_or_read():
    msg = Message(0, "x", np.zeros(1, np.float32), signature=Signature("allreduce", dtype="bool"))
    with pytest.raises(WireError, match="dtype code 255 in the signature"):
        doorbell.unpack(doorbell.pack(msg, 1))
