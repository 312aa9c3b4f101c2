"""Shared-memory transport: gRPC for control, shared memory for bytes. Introduced in lessons/10.

Ranks start, rendezvous, ship work and report errors over gRPC exactly as on the gRPC transport.
Between two ranks on one machine, a message's bytes go into a shared-memory segment of the sender's
(one copy), and its header (the same protobuf Header the wire carries, checked the same way) goes
over a Unix socket that is also the doorbell: the receiver blocks on it (never spins: 4 ranks share
2 cores here), and its end-of-file says at once that the peer is gone. The receiver reads, or
reduces, straight from the sender's segment; small messages travel inline on the socket. Ranks on
other machines get gRPC, as before: NCCL's SHM and NET transports, Open MPI's `sm` and `tcp`.
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

import numpy as np

from .base import Request
from .errors import RankFailure
from .grpc import GrpcCommunicator, host_identity
from .mailbox import Message
from .shm_link import INLINE_BYTES, TICK, ShmLink

log = logging.getLogger("allreduce_edu")


class ShmCommunicator(GrpcCommunicator):
    """A gRPC rank that sends to peers on its own machine through shared memory."""

    transport = "shm"

    def __init__(self, rank: int, world_size: int, *, token: str, **kwargs):
        super().__init__(rank, world_size, token=token, **kwargs)
        self._token = token.encode()
        self._shm: dict[int, ShmLink] = {}
        self._arrived = threading.Condition()
        # an abstract Unix socket: no file to leave behind; unguessable; token and uid checked
        self.shm_socket = f"allreduce-edu-{secrets.token_hex(16)}"
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self._listener.bind("\0" + self.shm_socket)
        self._listener.listen(world_size)
        self._listener.settimeout(TICK)
        self._acceptor = threading.Thread(target=self._accept, daemon=True,
                                          name=f"rank{rank}-shm-accept")
        self._acceptor.start()

    def connect(self, addresses: list[str], timeout: float | None = None) -> None:
        """Open the gRPC streams, then a shared-memory link to every peer on this machine
        (each rank dials the lower ranks and waits for the higher ones to dial it)."""
        timeout = self.timeout if timeout is None else timeout
        super().connect(addresses, timeout)
        deadline, me = time.monotonic() + timeout, host_identity()
        local = {dst for dst, link in self._links.items() if me and link.peer.host == me
                 and link.peer.shm}
        for dst in sorted(d for d in local if d < self.rank):
            self._dial(dst, self._links[dst].peer.shm, deadline)
        with self._arrived:
            while not local <= set(self._shm):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = sorted(local - set(self._shm))
                    raise RankFailure(f"rank {self.rank}: ranks {missing} on this machine did "
                                      f"not open their shared-memory links within {timeout:.0f} s",
                                      ranks=tuple(missing))
                self._arrived.wait(remaining)

    def peers_on_shm(self) -> list[int]:
        """The ranks this one reaches through shared memory."""
        return sorted(self._shm)

    def bytes_copied(self) -> int:
        """Bytes this rank's sends have copied into shared memory (or socket frames) so far;
        an array made by `send_buffer` is sent where it lies, uncopied."""
        return sum(link.copied for link in self._shm.values())

    def _dial(self, dst: int, name: str, deadline: float) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        sock.settimeout(max(deadline - time.monotonic(), 0.1))
        try:
            sock.connect("\0" + name)
            sock.sendall(self._token + b" " + str(self.rank).encode())
            if sock.recv(16) != b"ok":
                raise OSError(0, "it refused this rank")
        except OSError as e:
            sock.close()
            raise RankFailure(f"rank {self.rank} cannot open a shared-memory link to rank {dst}: "
                              f"{e.strerror or e}", ranks=(dst,)) from None
        self._add(dst, sock)

    def _accept(self) -> None:
        while not self.closing:
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
        try:
            pid, uid, gid = struct.unpack("3i", sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
            if uid != os.getuid():  # another user: refused before it can make us wait
                log.warning("rank %d refused a shared-memory link from pid %d (uid %d)",
                            self.rank, pid, uid)
                return None
            sock.settimeout(2.0)
            token, _, rank = sock.recv(256).partition(b" ")
        except OSError:
            return None
        # higher ranks dial this one (it dials the lower ones itself)
        ok = (hmac.compare_digest(token, self._token) and rank.isdigit()
              and self.rank < int(rank) < self.world_size and int(rank) not in self._shm)
        if not ok:
            log.warning("rank %d refused a shared-memory link from pid %d", self.rank, pid)
        return int(rank) if ok else None

    def _add(self, peer: int, sock: socket.socket) -> None:
        with self._arrived:
            self._shm[peer] = ShmLink(self, peer, sock)
            self._arrived.notify_all()

    def _post(self, dst: int, msg: Message, chunk) -> Request:
        link = self._shm.get(dst)
        if link is None:  # itself, or a rank on another machine: gRPC
            return super()._post(dst, msg, chunk)
        self._check_size(msg)
        request = Request(self, dst, msg.tag, msg.array.nbytes, msg.step, chunk)
        link.post(msg)  # eager: the data is in the segment when this returns
        return request

    def recv(self, src: int, tag: str, timeout: float | None = None) -> np.ndarray:
        link = self._shm.get(src)
        if link is None:
            return super().recv(src, tag, timeout)
        with link.caller():
            return super().recv(src, tag, timeout)

    def send_buffer(self, dst: int, shape, dtype) -> np.ndarray:
        link, dtype = self._shm.get(dst), np.dtype(dtype)
        shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(d) for d in shape)
        if link is None or dtype.itemsize * int(np.prod(shape)) <= INLINE_BYTES:
            return super().send_buffer(dst, shape, dtype)
        outbox = link.outbox(shape, dtype) if link.error is None else None
        return np.empty(shape, dtype) if outbox is None else outbox  # a full pool: a plain array

    def _pump(self, src: int):
        link = self._shm.get(src)
        return None if link is None else link.pump

    def close(self, drain: float = 5.0) -> None:
        if self._progress is not None:  # non-blocking collectives end while the links still work
            self._progress.close()
            self._progress = None
        self.closing = True
        self._listener.close()
        for link in list(self._shm.values()):
            link.close()
        self._acceptor.join(2 * TICK)
        super().close(drain)
