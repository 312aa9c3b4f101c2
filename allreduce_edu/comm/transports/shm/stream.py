"""The portable backend's doorbell channel (portable.py): frames over a TCP stream.

A stream keeps no frame boundaries, so each frame carries its lengths: (data length, handle
length), the handle (a segment's name), then the data. Frames are read as they arrive, whole or
not yet, so a reader never blocks inside a frame its peer is still sending.
"""

from __future__ import annotations

import collections
import itertools
import select
import socket
import struct
import time

from ...wire import WireError
from .backend import FRAME_BYTES, POLL_SLICE

LENGTHS = struct.Struct("<IB")  # a frame's data length, its handle's length; then both
RECV_BYTES = 256 << 10


def _ready(read: socket.socket | None, write: socket.socket | None, seconds: float):
    """(readable, writable) within `seconds`: poll where the system has it, else select. One
    socket may be both: its events are one mask (a second register would replace the first)."""
    if hasattr(select, "poll"):
        poller, masks = select.poll(), {}
        for sock, event in ((read, select.POLLIN), (write, select.POLLOUT)):
            if sock is not None:
                masks[sock.fileno()] = masks.get(sock.fileno(), 0) | event
        for fd, mask in masks.items():
            poller.register(fd, mask)
        events = dict(poller.poll(max(seconds, 0) * 1000))
        readable = select.POLLIN | select.POLLHUP | select.POLLERR
        return (read is not None and bool(events.get(read.fileno(), 0) & readable),
                write is not None and bool(events.get(write.fileno(), 0) & select.POLLOUT))
    r, w, _ = select.select([read] if read else [], [write] if write else [], [], max(seconds, 0))
    return bool(r), bool(w)


class StreamChannel:
    """A TCP socket carrying frames: (data length, handle length, handle, data). A frame goes
    whole or the channel ends (a send that times out half way shuts it: the peer never reads a
    torn frame); a send that has to wait reads the peer's frames meanwhile (two eager senders
    never deadlock), and one started while another is under way on this thread (a release from
    a finaliser) queues behind it, whole."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._out: collections.deque = collections.deque()  # memoryviews still to send
        self._flushing = False
        self._in = bytearray()
        self._eof = False

    def send(self, buffers: list, handle, deadline: float, on_readable) -> None:
        name = handle.encode() if handle is not None else b""
        data = [memoryview(b).cast("B") for b in buffers]
        frame = [memoryview(LENGTHS.pack(sum(len(d) for d in data), len(name)) + name)]
        frame += [d for d in data if len(d)]
        self._out.extend(frame)  # at once: a finaliser's frame can only come before or after
        if self._flushing:  # re-entered on this thread: the outer send flushes it
            return
        self._flushing = True
        try:
            self._flush(deadline, on_readable)
        finally:
            self._flushing = False

    def _flush(self, deadline: float, on_readable) -> None:
        while self._out:
            try:
                sent = (self.sock.sendmsg(list(itertools.islice(self._out, 64)))
                        if hasattr(self.sock, "sendmsg") else self.sock.send(self._joined()))
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._out.clear()  # a frame may be half sent: the channel ends here
                    self.shutdown()
                    raise TimeoutError from None
                readable, _ = _ready(self.sock, self.sock, min(remaining, POLL_SLICE))
                if readable:
                    on_readable()
                continue
            while sent:
                head = self._out[0]
                if sent >= len(head):
                    sent -= len(head)
                    self._out.popleft()
                else:
                    self._out[0], sent = head[sent:], 0

    def _joined(self) -> bytes:
        """The next pieces as one buffer (no sendmsg, as on Windows: one packet, not one each)."""
        pieces, size = [], 0
        for piece in self._out:
            if pieces and size + len(piece) > RECV_BYTES:
                break
            pieces.append(piece)
            size += len(piece)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def receive(self) -> list | None:
        if not self._eof:
            try:
                chunk = self.sock.recv(RECV_BYTES)
                self._in += chunk
                self._eof = not chunk
            except BlockingIOError:
                pass
        frames, pos, buf = [], 0, self._in
        while len(buf) - pos >= LENGTHS.size:
            length, name_length = LENGTHS.unpack_from(buf, pos)
            if length > FRAME_BYTES:
                raise WireError("a frame longer than a socket frame may be")
            end = pos + LENGTHS.size + name_length + length
            if end > len(buf):
                break
            start = pos + LENGTHS.size
            name = bytes(buf[start:start + name_length]).decode(errors="replace") or None
            frames.append((bytes(buf[start + name_length:end]), name))
            pos = end
        del buf[:pos]
        return None if self._eof and not frames else frames

    def wait(self, seconds: float) -> bool:
        if self._eof:
            return True
        try:
            return _ready(self.sock, None, seconds)[0]
        except (ValueError, OSError):  # closed under us
            return False

    def shutdown(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
