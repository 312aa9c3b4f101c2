"""Linux's shared-memory backend: memfd segments, their descriptors passed over an abstract
SOCK_SEQPACKET Unix socket. Lesson 10.

A segment is a `memfd`: memory with no name in any file system. Its descriptor travels to the one
peer that reads it (SCM_RIGHTS), both map it, both close the descriptor, and the kernel frees the
memory with the last mapping, whether the ranks closed, were SIGKILLed, or their parent was. The
socket keeps each frame whole (one seqpacket: a header, perhaps a descriptor), its abstract name
leaves no file behind, and the kernel tells the listener which user dialled (SO_PEERCRED).

A Python socket with a timeout polls before every send, and arming that timer cost more than the
send itself here (a VM: every timer is a trap to the host), so the deadline of a blocked send is the
kernel's (SO_SNDTIMEO) and the send itself never blocks (MSG_DONTWAIT): when the peer's socket is
full, `send` waits for room *or* for a frame from the peer, which `on_readable` takes. The peer may
be blocked sending to us: each drains the other, so two eager senders never deadlock.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets
import select
import socket
import struct
import sys
import time

import numpy as np

from ...wire import WireError
from .backend import FRAME_BYTES, POLL_SLICE, close_listening

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

NAME = "allreduce-edu"  # memfds show as /memfd:allreduce-edu ... in /proc/PID/fd (for leak tests)


def available() -> bool:
    """Whether this system has what the backend needs (Linux does; macOS and Windows do not)."""
    return (sys.platform.startswith("linux") and hasattr(os, "memfd_create")
            and fcntl is not None and hasattr(fcntl, "F_ADD_SEALS")
            and all(hasattr(socket, n) for n in ("SO_PEERCRED", "SOCK_SEQPACKET", "SOCK_CLOEXEC",
                                                 "send_fds", "recv_fds", "AF_UNIX")))


def _seals() -> int:
    return fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class MemfdSegment:
    """One memfd mapped into this process: `id` names it between the two ranks; `handle` is its
    descriptor until the peer has it."""

    def __init__(self, id: int, size: int, fd: int | None = None):
        self.id, self.size = id, size
        owner = fd is None
        if owner:
            fd = os.memfd_create(f"{NAME} segment {id}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, size)
            # sealed: nobody can shrink it under the peer's mapping (a read would SIGBUS)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _seals())
        try:
            if fcntl.fcntl(fd, fcntl.F_GET_SEALS) & _seals() != _seals():
                raise ValueError(f"segment {id} is not a sealed memfd")
            if os.fstat(fd).st_size != size:
                raise ValueError(f"segment {id} is {os.fstat(fd).st_size} bytes, not {size}")
            flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if owner else 0)
            self.map = mmap.mmap(fd, size, flags=flags)
        except BaseException:
            os.close(fd)
            raise
        self.handle = fd if owner else None  # the owner keeps it until the peer has it
        if not owner:
            os.close(fd)
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.bytes = np.frombuffer(self.map, np.uint8)

    def handed_over(self) -> None:
        if self.handle is not None:
            os.close(self.handle)
            self.handle = None

    def unlink(self) -> None:
        """Nothing to remove: a memfd has no name."""


class SeqpacketChannel:
    """A SOCK_SEQPACKET socket: one frame per packet, a descriptor beside it."""

    def __init__(self, sock: socket.socket, timeout: float):
        self.sock = sock  # for sending: the deadline of a blocked send is the kernel's
        sock.settimeout(None)
        seconds = max(timeout, 0.001)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                        struct.pack("ll", int(seconds), int(seconds % 1 * 1e6)))
        self._rsock = socket.socket(fileno=os.dup(sock.fileno()))  # for receiving: polled
        self._rsock.setblocking(False)

    def send(self, buffers: list, handle, deadline: float, on_readable) -> None:
        while True:
            try:
                if handle is not None:
                    socket.send_fds(self.sock, buffers, [handle], socket.MSG_DONTWAIT)
                else:
                    self.sock.sendmsg(buffers, (), socket.MSG_DONTWAIT)
                return
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError from None
                poller = select.poll()
                poller.register(self.sock, select.POLLOUT)
                poller.register(self._rsock, select.POLLIN)
                for fd, _ in poller.poll(min(remaining, POLL_SLICE) * 1000):
                    if fd == self._rsock.fileno():
                        on_readable()

    def receive(self) -> list | None:
        try:
            data, fds, flags, _ = socket.recv_fds(self._rsock, FRAME_BYTES, 1)
        except BlockingIOError:
            return []
        if not data:
            for fd in fds:
                os.close(fd)
            return None
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) > 1:
            for fd in fds:
                os.close(fd)
            raise WireError("a frame longer than a socket frame may be")
        return [(data, fds[0] if fds else None)]

    def wait(self, seconds: float) -> bool:
        try:
            poller = select.poll()
            poller.register(self._rsock, select.POLLIN)
            return bool(poller.poll(seconds * 1000))
        except (ValueError, OSError):  # closed under us
            return False

    def shutdown(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes our receiving thread; the peer sees EOF
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
        self._rsock.close()


class Dialler:
    """A peer that dialled; another user is refused before it can make us wait."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        pid, uid, _ = struct.unpack("3i", sock.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        self.who = f"pid {pid} (uid {uid})"
        self.refusal = "" if uid == os.getuid() else "another user"

    def hello(self, timeout: float) -> bytes:
        self.sock.settimeout(timeout)
        return self.sock.recv(256)

    def accept(self, comm_timeout: float) -> SeqpacketChannel:
        self.sock.sendall(b"ok")
        return SeqpacketChannel(self.sock, comm_timeout)

    def close(self) -> None:
        self.sock.close()


class Listener:
    """An abstract Unix socket: no file to leave behind; an unguessable name."""

    def __init__(self):
        self.address = f"{NAME}-{secrets.token_hex(16)}"
        self._sock = _seqpacket()
        self._sock.bind("\0" + self.address)
        self._sock.listen(64)

    def accept(self, timeout: float) -> Dialler | None:
        self._sock.settimeout(timeout)
        try:
            sock, _ = self._sock.accept()
        except TimeoutError:
            return None
        try:
            return Dialler(sock)
        except OSError:
            sock.close()
            return None

    def close(self) -> None:
        close_listening(self._sock)


def _seqpacket() -> socket.socket:
    return socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)


class Linux:
    """The backend (`scratch` is for the portable one: memfds have no names)."""

    name = "linux"

    def __init__(self, scratch=None):
        pass

    def listen(self) -> Listener:
        return Listener()

    def dial(self, address: str, hello: bytes, timeout: float,
             comm_timeout: float) -> SeqpacketChannel:
        sock = _seqpacket()
        try:
            sock.settimeout(timeout)
            sock.connect("\0" + address)
            sock.sendall(hello)
            if sock.recv(16) != b"ok":
                raise OSError(0, "it refused this rank")
            return SeqpacketChannel(sock, comm_timeout)
        except BaseException:
            sock.close()
            raise

    def new_segment(self, id: int, size: int) -> MemfdSegment:
        return MemfdSegment(id, size)

    def open_segment(self, id: int, size: int, handle, shared: bool = False) -> MemfdSegment:
        if not isinstance(handle, int):
            raise ValueError(f"segment {id} came without its descriptor")
        return MemfdSegment(id, size, handle)

    def discard(self, handle) -> None:
        if isinstance(handle, int):
            os.close(handle)

