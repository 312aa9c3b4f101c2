"""The portable shared-memory backend, on what Linux, macOS and Windows all have. Lesson 10.

A segment is named shared memory. On Linux and macOS it is an owner-only file (in RAM at /dev/shm
where there is one, else in the user's temp folder) with an unguessable name, mapped by the
sender, opened and mapped by the receiver, who then unlinks it: from then on it has no name, and
the memory goes with the last mapping. A Cluster gives its ranks a prefix for those names and
removes whatever still has it at close, so a rank SIGKILLed between creating a segment and its
peer mapping it leaves nothing behind either. On Windows it is a named mapping, which Windows
frees with its last handle.

The doorbell is a loopback TCP socket (every system has one; macOS has no SOCK_SEQPACKET and
Windows no Unix sockets to pass descriptors over), so frames carry their length (stream.py), and a
segment's name travels in its first frame instead of a descriptor. Only ranks that present the
cluster's token are accepted: any local process can dial 127.0.0.1; the token keeps it out.
"""

from __future__ import annotations

import ctypes
import glob
import mmap
import os
import re
import secrets
import socket
import stat
import sys
import tempfile
import time

import numpy as np

from .backend import close_listening
from .stream import StreamChannel

PREFIX = "allreduce-edu-"
NAMES = re.compile(rf"{PREFIX}[0-9a-f]{{8}}-[0-9a-f]{{24}}")  # all a peer may name: nothing else
WINDOWS = sys.platform == "win32"


def scratch_base() -> str:
    """Where segments' files go: RAM (/dev/shm) where the system has it, else the temp folder."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK):
        return "/dev/shm"
    return tempfile.gettempdir()


class Scratch:
    """The names one cluster's segments start with; `sweep()` removes any still there. A
    launcher hands its `prefix` to the ranks it starts (`Scratch(prefix)` there), and sweeps."""

    def __init__(self, prefix: str | None = None):
        if prefix is not None and not re.fullmatch(rf"{PREFIX}[0-9a-f]{{8}}-", prefix):
            raise ValueError(f"{prefix!r} is not a scratch prefix ({PREFIX}, 8 hex digits, -)")
        self.prefix = prefix or f"{PREFIX}{secrets.token_hex(4)}-"

    def sweep(self) -> None:
        """Remove what is still named with the prefix: regular files of this user only."""
        if WINDOWS:
            return
        for path in glob.glob(os.path.join(glob.escape(scratch_base()), self.prefix + "*")):
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and info.st_uid == getattr(os, "getuid", lambda: 0)():
                _unlink(path)


def _unlink(path: str) -> None:
    """Remove `path` if it is there and ours to remove (another user may plant a name in a
    shared folder: never an error for us)."""
    try:
        os.unlink(path)
    except OSError:
        pass


def _map_windows(tag: str, size: int, owner: bool) -> mmap.mmap:  # pragma: no cover - Windows
    """A named mapping: made by its owner; opened by the peer only if it still exists (mmap alone
    would make a fresh one of zeros, and the message would arrive as zeros, silently). The peer
    holds a handle while it maps, so the mapping cannot go in between."""
    if owner:
        return mmap.mmap(-1, size, tagname=tag)
    import _winapi
    handle = _winapi.OpenFileMapping(_winapi.FILE_MAP_READ, False, tag)  # OSError if gone
    try:
        return mmap.mmap(-1, size, tagname=tag)
    finally:
        _winapi.CloseHandle(handle)


class NamedSegment:
    """Named shared memory mapped into this process; `handle` is its name until the peer has it."""

    def __init__(self, id: int, size: int, prefix: str, name: str | None = None,
                 shared: bool = False):
        self.id, self.size, self.shared = id, size, shared
        owner = name is None
        self.name = name or prefix + secrets.token_hex(12)
        self.path = None if WINDOWS else os.path.join(scratch_base(), self.name)
        if WINDOWS:
            self.map = _map_windows("Local\\" + self.name, size, owner)
        else:
            self.map = self._map_file(owner)
        self.handle = self.name if owner else None
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.bytes = np.frombuffer(self.map, np.uint8)

    def _map_file(self, owner: bool) -> mmap.mmap:
        nofollow = getattr(os, "O_NOFOLLOW", 0)
        flags = os.O_RDWR | nofollow | (os.O_CREAT | os.O_EXCL if owner else 0)
        fd = os.open(self.path, flags, 0o600)
        try:
            if owner:  # reserved now (a full /dev/shm says so here, not as a SIGBUS mid-copy)
                allocate = getattr(os, "posix_fallocate", None)
                allocate(fd, 0, self.size) if allocate else os.ftruncate(fd, self.size)
            info = os.fstat(fd)
            if info.st_size != self.size or info.st_mode & 0o077:
                raise ValueError(f"segment {self.id} is {info.st_size} bytes with mode "
                                 f"{info.st_mode & 0o777:o}, not {self.size} owner-only bytes")
            if hasattr(os, "getuid") and info.st_uid != os.getuid():
                raise ValueError(f"segment {self.id} belongs to another user")
            if owner and hasattr(mmap, "MAP_POPULATE"):  # Linux: fault it in now, not mid-send
                return mmap.mmap(fd, self.size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
            return mmap.mmap(fd, self.size)  # shared, read and write
        except BaseException:
            if owner:
                self.unlink()
            raise
        finally:
            os.close(fd)
            if not owner and not self.shared:  # mapped (or refused): nobody needs its name
                self.unlink()

    def handed_over(self) -> None:
        self.handle = None

    def unlink(self) -> None:
        """Remove the name if it is still there (the peer never mapped it)."""
        if self.path is not None:
            _unlink(self.path)


class Dialler:
    """A process that dialled 127.0.0.1: anyone on this machine could have; the token decides."""

    refusal = ""

    def __init__(self, sock: socket.socket, address):
        self.sock, self.who = sock, f"{address[0]}:{address[1]}"

    def hello(self, timeout: float) -> bytes:
        """Its first line (at most 256 bytes, all of it within `timeout`: a dialler that trickles
        bytes holds the acceptor no longer than that)."""
        deadline, line = time.monotonic() + timeout, b""
        while not line.endswith(b"\n") and len(line) < 256:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no hello in time")
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(256 - len(line))
            if not chunk:
                break
            line += chunk
        return line.rstrip(b"\n")

    def accept(self, comm_timeout: float) -> StreamChannel:
        self.sock.sendall(b"ok")
        return StreamChannel(self.sock)

    def close(self) -> None:
        self.sock.close()


class Listener:
    """A TCP socket on 127.0.0.1: never reachable from another machine."""

    def __init__(self):
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.address = f"127.0.0.1:{self._sock.getsockname()[1]}"

    def accept(self, timeout: float) -> Dialler | None:
        self._sock.settimeout(timeout)
        try:
            sock, address = self._sock.accept()
        except TimeoutError:
            return None
        return Dialler(sock, address)

    def close(self) -> None:
        close_listening(self._sock)


class Portable:
    """The backend: segments named with `scratch`'s prefix (a cluster's; else this rank's)."""

    name = "portable"

    def __init__(self, scratch: Scratch | None = None):
        self.prefix = (scratch or Scratch()).prefix

    def listen(self) -> Listener:
        return Listener()

    def dial(self, address: str, hello: bytes, timeout: float,
             comm_timeout: float) -> StreamChannel:
        host, _, port = address.rpartition(":")
        if host != "127.0.0.1" or not port.isdigit():
            raise OSError(0, f"{address!r} is not a loopback doorbell")
        sock = socket.create_connection((host, int(port)), timeout)
        try:
            sock.sendall(hello + b"\n")
            reply = b""
            while len(reply) < 2:
                chunk = sock.recv(2 - len(reply))
                if not chunk:
                    break
                reply += chunk
            if reply != b"ok":
                raise OSError(0, "it refused this rank")
            return StreamChannel(sock)
        except BaseException:
            sock.close()
            raise

    def new_segment(self, id: int, size: int) -> NamedSegment:
        return NamedSegment(id, size, self.prefix)

    def open_segment(self, id: int, size: int, handle, shared: bool = False) -> NamedSegment:
        """`shared`: other peers map it too (a window): its owner removes the name, not we."""
        if not isinstance(handle, str) or not NAMES.fullmatch(handle):
            raise ValueError(f"segment {id} came without a name this rank would open")
        return NamedSegment(id, size, self.prefix, handle, shared)

    def discard(self, handle) -> None:
        """A name is nothing to close."""
