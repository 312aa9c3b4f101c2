"""Symmetric windows over shared memory (comm.window; lesson 18).

A rank makes its window as it makes any segment (the backend's: a memfd, or named shared memory),
and hands it to every peer on the machine in a frame of its own kind on their link (KIND: the
descriptor or the name travels as a segment's does). Each peer maps it beside its own, so every
rank reaches every window with plain loads and stores: what NCCL's `ncclCommWindowRegister` and
torch's `symm_mem.rendezvous` set up between GPUs. A portable window's name is removed once every
rank has mapped every window (`settled`, after the window's first barrier): from then on nothing
is left to map, and the memory goes with the last mapping, even after a SIGKILL.
"""

from __future__ import annotations

import struct
import time

from ...errors import CollectiveMismatch, CollectiveTimeout
from ...window import MAX_WINDOW_BYTES, WindowsUnavailable, pad_bytes
from ...wire import WireError

KIND = b"W"  # a window frame's first byte
BODY = struct.Struct("<QQ")  # the window's number, its size in bytes
MAX_WINDOWS = 64  # windows one peer may hold mapped here at once
WAIT_SLICE = 0.05  # a rank waiting for a peer's window looks at its deadline this often


def take(link, body, handle) -> None:
    """A peer's window frame: map its window (the handle is used up here)."""
    try:
        if handle is None or len(body) != BODY.size:
            raise WireError("a window frame without its memory")
        number, size = BODY.unpack(body)
        limit = pad_bytes(link.comm.world_size) + MAX_WINDOW_BYTES
        if number in link.windows or len(link.windows) >= MAX_WINDOWS or not 0 < size <= limit:
            raise WireError(f"window {number} of {size} bytes: not a new window within "
                            f"{MAX_WINDOWS} windows of at most {limit} bytes")
        given, handle = handle, None
        try:
            link.windows[number] = link.backend.open_segment(number, size, given, shared=True)
        except (OSError, ValueError) as e:
            raise WireError(f"window {number} cannot be mapped: {e}") from None
    finally:
        if handle is not None:
            link.backend.discard(handle)


def open_window(nearby, number: int, size: int, deadline: float):
    """Every rank's window `number` of `size` bytes, mapped here (rank order), and `settled()`,
    to call once every rank has mapped every window."""
    comm = nearby.comm
    peers = [p for p in range(comm.world_size) if p != comm.rank]
    away = [p for p in peers if p not in nearby.links]
    if away:
        raise WindowsUnavailable(f"rank {comm.rank}: ranks {away} are on other machines (reached "
                                 f"over gRPC): a symmetric window needs every rank on this one")
    if len(nearby.windows) >= MAX_WINDOWS:
        raise ValueError(f"rank {comm.rank} holds {MAX_WINDOWS} windows open: close one first")
    try:
        mine = nearby.backend.new_segment(number, size)
    except OSError as e:
        raise MemoryError(f"rank {comm.rank}: no room for a {size}-byte window: {e}") from None
    nearby.windows[number] = mine

    def settled() -> None:
        mine.handed_over()  # a memfd's descriptor closes: the mappings keep the memory
        mine.unlink()  # a named window loses its name

    try:
        for peer in peers:
            nearby.links[peer].send_frame([KIND, BODY.pack(number, size)], mine.handle)
        buffers = []
        for peer in range(comm.world_size):
            if peer == comm.rank:
                buffers.append(mine.bytes)
                continue
            theirs = _arrival(comm, nearby.links[peer], number, deadline)
            if theirs.size != size:
                raise CollectiveMismatch(f"rank {peer} opened window {number} with "
                                         f"{theirs.size} bytes, rank {comm.rank} with {size}",
                                         ranks=(peer, comm.rank))
            buffers.append(theirs.bytes)
    except BaseException:  # nothing of a window that never opened stays: descriptor, name, slot
        settled()
        close_window(nearby, number)
        raise
    return buffers, settled


def _arrival(comm, link, number: int, deadline: float):
    """The peer's window `number`, once its frame has come (read on this thread)."""
    while number not in link.windows:
        if link.error is not None:
            raise link.error
        trouble = comm.mailbox.trouble(link.peer, f"its window {number}")
        if trouble is not None:
            raise trouble
        if time.monotonic() > deadline:
            raise CollectiveTimeout(f"rank {comm.rank}: rank {link.peer} did not open symmetric "
                                    f"window {number} in time; did it call something else?",
                                    ranks=(link.peer,), waiting_for=link.peer)
        with link.receiving():
            link.pump(WAIT_SLICE)
    return link.windows[number]


def close_window(nearby, number: int) -> None:
    """Forget window `number`, this rank's and its peers' (the memory goes with its last view)."""
    nearby.windows.pop(number, None)
    for link in nearby.links.values():
        link.windows.pop(number, None)
