"""Shared-memory transport: gRPC for control, shared memory for bytes. Introduced in lessons/10.

Ranks start, rendezvous, ship work and report errors over gRPC exactly as on the gRPC transport.
Between two ranks on one machine, a message's bytes go into a shared-memory segment of the sender's
(one copy), and its header (the wire's fields in a fixed binary layout, comm/doorbell.py, checked
by the wire's rules) goes over a Unix socket that is also the doorbell: the receiver blocks on it
(never spins: 4 ranks share 2 cores here), and its end-of-file says at once that the peer is gone.
The receiver reads, or reduces, straight from the sender's segment; small messages travel inline
on the socket. Ranks on other machines get gRPC, as before: NCCL's SHM and NET transports, Open
MPI's `sm` and `tcp`.

Shared memory is a kind of link, not a kind of communicator: `ShmLinks` makes a ShmLink to each
peer on this machine, and the GrpcCommunicator's peer -> link table (`comm.routes`) sends through
it in place of that peer's gRPC stream.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import socket
import struct
import threading
import time

from .errors import RankFailure
from .shm_link import TICK, ShmLink

log = logging.getLogger("allreduce_edu")


class ShmLinks:
    """A rank's shared-memory links to the peers on its machine, and the socket they dial:
    the `nearby` of a GrpcCommunicator (`GrpcCommunicator(..., nearby=ShmLinks)`), which sends
    through them instead of its gRPC streams."""

    def __init__(self, comm):
        self.comm = comm
        self.links: dict[int, ShmLink] = {}  # peer -> its link
        self._token = comm.token.encode()
        self._arrived = threading.Condition()
        self._closing = False
        # an abstract Unix socket: no file to leave behind; unguessable; token and uid checked
        self.name = f"allreduce-edu-{secrets.token_hex(16)}"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self._listener.bind("\0" + self.name)
        self._listener.listen(comm.world_size)
        self._listener.settimeout(TICK)
        self._acceptor = threading.Thread(target=self._accept, daemon=True,
                                          name=f"rank{comm.rank}-shm-accept")
        self._acceptor.start()

    def connect(self, here: dict[int, str], deadline: float) -> dict[int, ShmLink]:
        """A link to every peer in `here` (peer -> its socket's name): this rank dials the lower
        ranks and waits for the higher ones to dial it."""
        rank = self.comm.rank
        for dst in sorted(d for d in here if d < rank):
            self._dial(dst, here[dst], deadline)
        with self._arrived:
            while not set(here) <= set(self.links):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = sorted(set(here) - set(self.links))
                    raise RankFailure(f"rank {rank}: ranks {missing} on this machine did not "
                                      f"open their shared-memory links in time",
                                      ranks=tuple(missing))
                self._arrived.wait(remaining)
            return dict(self.links)

    def _dial(self, dst: int, name: str, deadline: float) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        sock.settimeout(max(deadline - time.monotonic(), 0.1))
        try:
            sock.connect("\0" + name)
            sock.sendall(self._token + b" " + str(self.comm.rank).encode())
            if sock.recv(16) != b"ok":
                raise OSError(0, "it refused this rank")
        except OSError as e:
            sock.close()
            raise RankFailure(f"rank {self.comm.rank} cannot open a shared-memory link to rank "
                              f"{dst}: {e.strerror or e}", ranks=(dst,)) from None
        self._add(dst, sock)

    def _accept(self) -> None:
        while not self._closing:
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # the listener closed
            peer = self._handshake(sock)
            try:
                if peer is None:
                    raise OSError("refused")
                sock.sendall(b"ok")
                self._add(peer, sock)
            except OSError:  # refused, or the dialler gave up meanwhile
                sock.close()

    def _handshake(self, sock: socket.socket) -> int | None:
        """The dialling peer's rank, if it knows the token and runs as this user; else None."""
        me = self.comm.rank
        try:
            pid, uid, gid = struct.unpack("3i", sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
            if uid != os.getuid():  # another user: refused before it can make us wait
                log.warning("rank %d refused a shared-memory link from pid %d (uid %d)",
                            me, pid, uid)
                return None
            sock.settimeout(2.0)
            token, _, rank = sock.recv(256).partition(b" ")
        except OSError:
            return None
        # higher ranks dial this one (it dials the lower ones itself)
        ok = (hmac.compare_digest(token, self._token) and rank.isdigit()
              and me < int(rank) < self.comm.world_size and int(rank) not in self.links)
        if not ok:
            log.warning("rank %d refused a shared-memory link from pid %d", me, pid)
        return int(rank) if ok else None

    def _add(self, peer: int, sock: socket.socket) -> None:
        with self._arrived:
            self.links[peer] = ShmLink(self.comm, peer, sock)
            self._arrived.notify_all()

    def close(self) -> None:
        """Stop accepting, end every link (the peers see end of file)."""
        self._closing = True
        self._listener.close()
        for link in list(self.links.values()):
            link.close()
        self._acceptor.join(2 * TICK)
