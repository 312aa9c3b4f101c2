"""Shared-memory transport: gRPC for control, shared memory for bytes. Introduced in lessons/10.

Ranks start, rendezvous, ship work and report errors over gRPC exactly as on the gRPC transport.
Between two ranks on one machine, a message's bytes go into a shared-memory segment of the sender's
(one copy), and its header (the wire's fields in a fixed binary layout, doorbell.py, checked by
the wire's rules) goes over a socket that is also the doorbell: its end of file says at once that
the peer is gone. Small messages, header and data, go through a ring of slots in shared memory
instead (eager.py, NCCL's LL protocol): the receiver spins a little, yielding its core (4 ranks
share 2 cores here), then sleeps on the socket, and only then is its doorbell rung. What
a segment and a socket are is the backend's (backend.py): memfds and a Unix socket on Linux,
named shared memory and a loopback socket elsewhere (linux.py, portable.py).
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
import threading
import time

from ...errors import RankFailure
from . import linux, portable
from .backend import ENV
from .link import TICK, ShmLink
from .window import close_window, open_window

log = logging.getLogger("allreduce_edu")


class ShmLinks:
    """A rank's shared-memory links to the peers on its machine, and the socket they dial:
    the `nearby` of a GrpcCommunicator (`GrpcCommunicator(..., nearby=ShmLinks)`), which sends
    through them instead of its gRPC streams."""

    def __init__(self, comm, scratch=None):
        self.comm = comm
        self.links: dict[int, ShmLink] = {}  # peer -> its link
        self._token = comm.token.encode()
        self._arrived = threading.Condition()
        self._closing = False
        self.refused = 0  # diallers turned away: strangers, or a peer that dialled twice
        self.windows: dict = {}  # window number -> this rank's window (comm.window)
        self.backend = chosen()(scratch)
        self._listener = self.backend.listen()
        # what Ping hands out: the backend too, so that two backends never dial each other
        self.name = f"{self.backend.name}:{self._listener.address}"
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
        backend, _, address = name.partition(":")
        try:
            if backend != self.backend.name:
                raise OSError(0, f"it uses the {backend} backend, this rank {self.backend.name} "
                                 f"(set {ENV} alike for every rank)")
            channel = self.backend.dial(address, self._token + b" " + str(self.comm.rank).encode(),
                                        max(deadline - time.monotonic(), 0.1), self.comm.timeout)
        except OSError as e:
            raise RankFailure(f"rank {self.comm.rank} cannot open a shared-memory link to rank "
                              f"{dst}: {e.strerror or e}", ranks=(dst,)) from None
        self._add(dst, channel)

    def _accept(self) -> None:
        while not self._closing:
            try:
                dialler = self._listener.accept(TICK)
            except OSError:
                if self._closing:
                    return  # the listener closed
                time.sleep(0.05)  # a dialler that reset first, or no descriptors left: go on
                continue
            if dialler is None:
                continue
            try:
                peer = self._handshake(dialler)
                if peer is None:
                    raise OSError("refused")
                self._add(peer, dialler.accept(self.comm.timeout))
            except OSError:  # refused, or the dialler gave up meanwhile
                dialler.close()

    def _handshake(self, dialler) -> int | None:
        """The dialling peer's rank, if it knows the token (and, where the backend can tell,
        runs as this user); else None."""
        if dialler.refusal:  # refused before it can make us wait
            return self._refused(f"{dialler.who}: {dialler.refusal}")
        try:
            token, _, rank = dialler.hello(2.0).partition(b" ")
        except OSError:
            return None
        # higher ranks dial this one (it dials the lower ones itself)
        ok = (hmac.compare_digest(token, self._token) and rank.isdigit()
              and self.comm.rank < int(rank) < self.comm.world_size
              and int(rank) not in self.links)
        return int(rank) if ok else self._refused(dialler.who)

    def _refused(self, who: str) -> None:
        """Log the first stranger, count the rest: a flood of them must not flood the output."""
        self.refused += 1
        if self.refused == 1:
            log.warning("rank %d refused a shared-memory link from %s (later refusals are only "
                        "counted: comm.nearby.refused)", self.comm.rank, who)

    def _add(self, peer: int, channel) -> None:
        with self._arrived:
            self.links[peer] = ShmLink(self.comm, peer, channel, self.backend)
            self._arrived.notify_all()

    def open_window(self, number: int, size: int, deadline: float):
        """Every rank's symmetric window `number` (window.py)."""
        return open_window(self, number, size, deadline)

    def close_window(self, number: int) -> None:
        close_window(self, number)

    def close(self) -> None:
        """Stop accepting, end every link (the peers see end of file)."""
        self._closing = True
        self._listener.close()
        for link in list(self.links.values()):
            link.close()
        self._acceptor.join(2 * TICK)


def chosen() -> type:
    """The backend class this process uses: ALLREDUCE_EDU_SHM_BACKEND, else linux where it
    works."""
    wanted = os.environ.get(ENV, "").strip().lower()
    if wanted not in ("", "linux", "portable"):
        raise ValueError(f"{ENV}={wanted!r}: valid values are 'linux' and 'portable'")
    if wanted == "portable" or (not wanted and not linux.available()):
        return portable.Portable
    if not linux.available():
        raise RuntimeError(f"{ENV}=linux, but this system lacks what it needs (memfd, sealing, "
                           f"SO_PEERCRED, SOCK_SEQPACKET): use {ENV}=portable")
    return linux.Linux
