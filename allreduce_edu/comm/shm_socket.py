"""The shared-memory link's socket, sending side (allreduce_edu.comm.shm_link): a frame goes out
without a Python-level timeout, and a sender whose peer's socket is full reads its own meanwhile.

A Python socket with a timeout polls before every send, and arming that timer cost more than the
send itself here (a VM: every timer is a trap to the host), so the deadline of a blocked send is the
kernel's (SO_SNDTIMEO) and the send itself never blocks (MSG_DONTWAIT): when the peer's socket is
full, `send_frame` waits for room *or* for a frame from the peer, which it hands to `read_one`.
The peer may be blocked sending to us: each drains the other, so two eager senders never deadlock.
"""

from __future__ import annotations

import select
import socket
import struct
import time

POLL_SLICE = 0.5  # a blocked sender looks at its link's state this often


def without_python_timeout(sock: socket.socket, timeout: float) -> None:
    """Make `sock` blocking, with `timeout` kept by the kernel for a send that has to wait."""
    sock.settimeout(None)
    seconds = max(timeout, 0.001)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                    struct.pack("ll", int(seconds), int(seconds % 1 * 1e6)))


def send_frame(sock: socket.socket, buffers: list, fds, deadline: float,
               incoming: socket.socket, read_one) -> None:
    """Send one frame (and `fds`) by `deadline` (else TimeoutError); while `sock` is full, call
    `read_one()` whenever `incoming` has a frame."""
    while True:
        try:
            if fds:
                socket.send_fds(sock, buffers, fds, socket.MSG_DONTWAIT)
            else:
                sock.sendmsg(buffers, (), socket.MSG_DONTWAIT)
            return
        except BlockingIOError:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError from None
            poller = select.poll()
            poller.register(sock, select.POLLOUT)
            poller.register(incoming, select.POLLIN)
            for fd, _ in poller.poll(min(remaining, POLL_SLICE) * 1000):
                if fd == incoming.fileno():
                    read_one()
