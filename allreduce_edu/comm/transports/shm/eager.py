"""Eager slots: a link's small messages through shared memory, NCCL's LL protocol (lesson 18).

Each side of a link makes a ring of SLOTS slots (a segment of the backend's, handed to the peer
once in a frame of its own kind, RING) and writes its small messages into it; the peer reads them
there. No socket, no system call, no thread hop on the way:

    word 0 of the ring: how many messages the reader has taken (the reader writes it)
    word 8: how many of the reader's threads sleep on the socket (the reader writes it)
    slot k (of SLOTS): the frame (the doorbell's header + data), 4 bytes per 8-byte word, the
        other 4 the message's number (its flag); the first word's 4 bytes are the frame's length

Every 8-byte word carries its own flag, stored with its data (one memoryview copy of aligned
8-byte words, at most a slot: each lands whole): a reader that sees the flag it expects in every
word has the whole frame, and needs no fence and no second message (lesson 18's torn read is what a
separate flag allows).
Flags are message numbers, so a slot reused SLOTS messages later never passes for the new one.

A reader spins a little (giving its core away at every look), if its last wait was that short
and its cluster has no more ranks than the machine has cores (else a spin takes a core from a
rank at work), then says it sleeps and blocks on the link's socket; a writer rings that doorbell
(a one-byte frame) only when the reader sleeps. Both sides put a full barrier
between their store and their load (an uncontended lock is one on x86); where it is not (ARM), a
sleeper looks again after NAP at the latest, so a wake-up that crossed the announcement costs
NAP, never a hang. A message that does not fit a slot, or finds the ring full, goes on the
socket instead; every message carries its link's sequence number, and the reader takes ring and
socket in that order (link.py).
"""

from __future__ import annotations

import array
import contextlib
import os
import struct
import threading
import time

import numpy as np

from ...errors import CollectiveTimeout, RankFailure
from ...wire import WireError
from .doorbell import unpack

RING = b"E"  # a ring frame's first byte: the peer's ring, its memory as the frame's handle
DOORBELL = b"D"  # "there is something in my ring for you, and you sleep"
SLOTS = 32
SLOT_WORDS = 256  # 2 KiB a slot
CAPACITY = 4 * (SLOT_WORDS - 1)  # the longest frame a slot holds
HEAD_WORDS = 16  # taken: word 0, sleepers: word 8 (their own cache lines)
RING_BYTES = 8 * (HEAD_WORDS + SLOTS * SLOT_WORDS)
SPIN_S = 300e-6  # how long a reader spins, yielding its core at every look, before it sleeps
NAP = 5e-3  # the longest a sleeping reader waits before it looks at the ring again
YIELD = getattr(os, "sched_yield", lambda: time.sleep(0))  # Windows has no sched_yield


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
_barrier = threading.Lock()


def barrier() -> None:
    """A full memory barrier on x86 (a locked instruction); see the module's note for ARM."""
    with _barrier:
        pass


MASK = 0xFFFFFFFF
PAD = bytes(4)  # a frame's tail, up to a whole 4-byte half word
WORD = struct.Struct("<Q")


class Outgoing:
    """This rank's ring towards one peer: `put` a frame, or say it does not fit."""

    def __init__(self, segment):
        self.segment, self.sent = segment, 0
        self.words = segment.bytes[:RING_BYTES].view(np.uint64)
        self.view = memoryview(segment.bytes)[:RING_BYTES]

    def put(self, head: bytes, data: np.ndarray) -> bool:
        """Write one frame (`head` + `data`, C-contiguous) into the next slot; False if it does
        not fit or the ring is full (the reader has not taken SLOTS messages yet)."""
        length = len(head) + data.nbytes
        if length > CAPACITY or self.sent - WORD.unpack_from(self.view, 0)[0] >= SLOTS:
            return False
        self.sent += 1
        words = (length + 3) // 4 + 1
        slot = array.array("I", [self.sent & MASK]) * (2 * words)  # word by word: data, flag
        slot[0] = length  # the first word's 4 bytes: the frame's length
        slot[2::2] = array.array("I", b"".join((head, data, PAD[:-length % 4])))
        start = 8 * (HEAD_WORDS + (self.sent - 1) % SLOTS * SLOT_WORDS)
        self.view[start:start + 8 * words] = memoryview(slot).cast("B")  # whole 8-byte words
        return True

    def asleep(self) -> bool:
        """Whether the reader sleeps (after a barrier: our slot is visible before we look)."""
        barrier()
        return WORD.unpack_from(self.view, 64)[0] != 0


class Incoming:
    """The peer's ring towards this rank, mapped here: `peek` the next frame, `advance` past it;
    `wait` for one (spin, then sleep on the socket)."""

    def __init__(self, segment, spins: bool = True):
        self.segment, self.taken, self.spins = segment, 0, spins
        self.view = memoryview(segment.bytes)[:RING_BYTES]
        self._sleepers, self._lock = 0, threading.Lock()
        self.spin = True  # whether the next wait spins before it sleeps (wait)

    def _start(self) -> int:
        return 8 * (HEAD_WORDS + self.taken % SLOTS * SLOT_WORDS)

    def ready(self) -> bool:
        """Whether the next slot's first word carries the next message's flag."""
        return WORD.unpack_from(self.view, self._start())[0] >> 32 == (self.taken + 1) & MASK

    def peek(self) -> memoryview | None:
        """The next frame, whole (copied out of the slot), or None if it is not all there yet;
        ValueError if the peer wrote a length no slot holds."""
        start, flag = self._start(), (self.taken + 1) & MASK
        first = WORD.unpack_from(self.view, start)[0]
        if first >> 32 != flag:
            return None
        length = first & MASK
        if length > CAPACITY:
            raise ValueError(f"a slot says it holds {length} bytes (at most {CAPACITY})")
        words = (length + 3) // 4 + 1
        slot = array.array("I")
        slot.frombytes(self.view[start:start + 8 * words])  # one copy: each word whole
        if slot[1::2].count(flag) != words:
            return None  # the writer is still writing it
        return memoryview(slot[2::2]).cast("B")[:length]

    def advance(self) -> None:
        """The frame `peek` gave is handled: its slot is the writer's again."""
        self.taken += 1
        WORD.pack_into(self.view, 0, self.taken)

    def wait(self, channel, seconds: float) -> bool:
        """Until the ring or the socket has something (True), or `seconds` pass (False). It spins
        first only if the last wait ended within SPIN_S: a rank that waits long (a large message,
        a slow link, a late peer) sleeps at once instead of taking a core from ranks at work."""
        if self.ready():  # already there: no spin, and no "I sleep" that would cost a doorbell
            return True
        start, looks = time.monotonic(), 0
        while self.spins and self.spin and time.monotonic() - start < min(SPIN_S, seconds):
            YIELD()  # a rank waiting for this core gets it; else this returns at once
            if self.ready() or (looks % 8 == 7 and channel.wait(0)):
                return True
            looks += 1
        with self.asleep():
            got = self.ready() or channel.wait(min(NAP, seconds)) or self.ready()
        self.spin = got and time.monotonic() - start < SPIN_S
        return got

    @contextlib.contextmanager
    def asleep(self):
        """This thread is about to sleep on the socket: writers ring the doorbell meanwhile."""
        with self._lock:
            self._sleepers += 1
            WORD.pack_into(self.view, 64, self._sleepers)
        barrier()  # our word is visible before we look at the ring once more
        try:
            yield
        finally:
            with self._lock:
                self._sleepers -= 1
                WORD.pack_into(self.view, 64, self._sleepers)


# --- a link's two rings (link.py and kinds.py call these) ------------------------------------
def open_ring(link) -> Outgoing | None:
    """This side's ring towards `link`'s peer, handed to it; None if there is no room for one (or
    the peer is gone already: the link finds that out soon enough). Small messages then go on
    the socket, as before."""
    try:
        segment = link.backend.new_segment(0, RING_BYTES)
    except OSError:
        return None
    try:
        link.send_frame([RING, RING_BYTES.to_bytes(8, "little")], segment.handle)
    except (OSError, RankFailure, CollectiveTimeout):
        segment.handed_over()
        segment.unlink()
        return None
    segment.handed_over()  # the peer maps it (a portable one's name goes then)
    return Outgoing(segment)


def map_ring(link, body, handle) -> None:
    """The peer's ring frame: map its ring (the handle is used up here)."""
    try:
        if (handle is None or link.incoming is not None or len(body) != 8
                or int.from_bytes(body, "little") != RING_BYTES):
            raise WireError("a ring frame that is not one new ring")
        given, handle = handle, None
        try:
            # a spinning reader only where every rank can have a core: with more ranks than
            # cores (8 on 2 here), a spin takes the core from a rank at work
            link.incoming = Incoming(link.backend.open_segment(0, RING_BYTES, given),
                                     spins=link.comm.world_size <= cores())
        except (OSError, ValueError) as e:
            raise WireError(f"the peer's ring cannot be mapped: {e}") from None
    finally:
        if handle is not None:
            link.backend.discard(handle)


def ring_one(link) -> bool:
    """Take the next message from the peer's ring, if it is there and comes next."""
    ring = link.incoming
    try:
        frame = ring.peek() if ring is not None else None
    except ValueError as e:
        raise WireError(str(e)) from None
    if frame is None:
        return False
    h, data = unpack(frame)
    if h.seq != link.assembler.messages + 1:
        if h.seq <= link.assembler.messages:
            raise WireError(f"a ring frame numbered {h.seq} after message "
                            f"{link.assembler.messages}")
        return False  # the message before it went on the socket: that one comes first
    message = link.assembler.add_decoded(h, data)
    ring.advance()
    if message is not None:
        link.comm.deliver(message)
    return True
