"""The seam under the shared-memory transport: what a backend gives a link (gloo's
`transport::Pair` is the model: one interface, one module per backend). Lesson 10.

Two backends implement it, chosen once per process (shm.chosen(), from ENV):

- `linux`: memfd segments whose descriptors travel over an abstract SOCK_SEQPACKET Unix socket;
  the kernel names the peer's user (SO_PEERCRED). Nothing ever has a name in a file system.
- `portable` (Linux, macOS, Windows): named shared memory (a file in a private folder, unlinked
  as soon as the receiver has mapped it; a named mapping on Windows) and a loopback TCP socket
  whose frames carry a length; the cluster's token is the only key.

ALLREDUCE_EDU_SHM_BACKEND=portable (or linux) forces one; by default Linux uses `linux`, every
other system `portable`.
"""

from __future__ import annotations

import socket
from typing import Protocol, runtime_checkable

ENV = "ALLREDUCE_EDU_SHM_BACKEND"
INLINE_BYTES = 32 << 10  # messages up to this size travel in the frame itself
FRAME_BYTES = INLINE_BYTES + (16 << 10)  # one frame: a header plus at most INLINE_BYTES
POLL_SLICE = 0.5  # a sender blocked on a full channel looks at its link this often


@runtime_checkable
class Segment(Protocol):
    """Shared memory mapped into this process: `bytes` (uint8 array over it) at `address`."""

    id: int
    size: int
    address: int  # where it is mapped in this process
    bytes: object  # a uint8 NumPy array over all of it
    handle: object  # what the peer needs to map it, until it has it (handed_over); else None

    def handed_over(self) -> None:
        """The peer has mapped it (or has what it needs to): drop what only it needed."""
        ...

    def unlink(self) -> None:
        """Remove its name, if it has one the peer never took away (the link closes)."""
        ...


@runtime_checkable
class Channel(Protocol):
    """One peer's doorbell: whole frames in order, each with at most one segment handle."""

    def send(self, buffers: list, handle, deadline: float, on_readable) -> None:
        """Send one frame by `deadline` (else TimeoutError; OSError: the peer is gone); while
        the peer cannot take it, call `on_readable()` whenever a frame from it is waiting."""
        ...

    def receive(self) -> list[tuple[bytes, object]] | None:
        """The frames (data, handle or None) that are complete now, without waiting; [] if none
        yet; None at end of file (the peer closed or died). WireError: a frame breaks the
        rules."""
        ...

    def wait(self, seconds: float) -> bool:
        """Whether something arrived to `receive` within `seconds`."""
        ...

    def shutdown(self) -> None:
        """Wake every waiter; the peer sees end of file."""
        ...

    def close(self) -> None:
        ...


@runtime_checkable
class Dialler(Protocol):
    """A peer that dialled a Listener, not yet accepted."""

    who: str  # for a refusal's log line: "pid 12 (uid 1000)", "127.0.0.1:5555"
    refusal: str  # why it is refused before it may say anything ("another user"); "" if not

    def hello(self, timeout: float) -> bytes:
        """Its first bytes (the cluster's token and its rank)."""
        ...

    def accept(self, comm_timeout: float) -> Channel:
        """Tell it "ok"; the channel to it."""
        ...

    def close(self) -> None:
        ...


@runtime_checkable
class Listener(Protocol):
    address: str  # what peers dial; Ping hands it out

    def accept(self, timeout: float) -> Dialler | None:
        """The next peer that dialled, or None after `timeout`; OSError once closed."""
        ...

    def close(self) -> None:
        """Stop listening; an `accept` waiting in another thread raises OSError at once where
        the system can wake it (close_listening), else within its `timeout`."""
        ...


def close_listening(sock: socket.socket) -> None:
    """Close a listening socket and wake a thread waiting in its accept: closing alone wakes
    nobody, so a rank's close would wait out the acceptor's whole TICK; shutting it down first
    does, on Linux (elsewhere it may refuse: the acceptor then sees the close within its TICK)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # not connected (macOS, Windows): nothing to wake it with
    sock.close()


@runtime_checkable
class Backend(Protocol):
    """How ranks on one machine find each other and share memory; made once per rank as
    `Backend(scratch)` (`scratch`: how its cluster names shared memory, portable.Scratch; or
    None)."""

    name: str

    def listen(self) -> Listener:
        """Start listening for this rank's peers."""
        ...

    def dial(self, address: str, hello: bytes, timeout: float, comm_timeout: float) -> Channel:
        """A channel to the peer listening at `address`, after it accepted `hello`."""
        ...

    def new_segment(self, id: int, size: int) -> Segment:
        ...

    def open_segment(self, id: int, size: int, handle, shared: bool = False) -> Segment:
        """The peer's segment; ValueError or OSError if `handle` is not one. `shared`: other
        ranks map it too (a symmetric window), so its name, if it has one, stays for them."""
        ...

    def discard(self, handle) -> None:
        """A received handle that will not be used (a refused frame)."""
        ...
