"""Every transport in one table: its name -> how a rank builds its communicator and how a Cluster
sets its ranks up. Read by the Cluster, the rank worker and the rendezvous (lessons/10).

A new transport is one module in comm/ (a Communicator, or a link for the GrpcCommunicator's
peer -> link table, as comm/transports/shm is) plus one row here.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from ..comm.transports.grpc.communicator import GrpcCommunicator
from ..comm.transports.shm import ShmLinks, chosen
from ..comm.transports.shm.portable import Portable, Scratch
from .processes import ProcessRanks
from .threads import ThreadRanks


@dataclass(frozen=True)
class Transport:
    """One row: `communicator(rank, world_size, token=, host=, port=, timeout=, tls=, scratch=)`
    builds a rank process's communicator (None: ranks are threads, built by `ranks`);
    `ranks(transport, world_size, timeout, host, tls, links)` starts a Cluster's ranks;
    `launchable`: init() and `allreduce-edu launch --transport` may use it; `scratch()`: what a
    Cluster hands its ranks to name their shared memory by, and `sweep()`s at close, or None."""

    name: str
    summary: str
    ranks: Callable
    communicator: Callable | None = None
    launchable: bool = False
    scratch: Callable | None = None

    @property
    def processes(self) -> bool:
        """Whether its ranks are processes (each a server), not threads of this one."""
        return self.communicator is not None


def grpc_rank(rank: int, world_size: int, scratch=None, **kwargs) -> GrpcCommunicator:
    return GrpcCommunicator(rank, world_size, **kwargs)


def shm_rank(rank: int, world_size: int, scratch=None, **kwargs) -> GrpcCommunicator:
    return GrpcCommunicator(rank, world_size, nearby=partial(ShmLinks, scratch=scratch), **kwargs)


def shm_scratch() -> Scratch | None:
    """The names of the portable backend's segments (the linux one's have none)."""
    return Scratch() if chosen() is Portable else None


def process_ranks(transport: Transport, world_size, timeout, host, tls, links) -> ProcessRanks:
    return ProcessRanks(world_size, secrets.token_hex(16), host, timeout, tls, links, transport)


def thread_ranks(transport: Transport, world_size, timeout, host, tls, links) -> ThreadRanks:
    return ThreadRanks(world_size, timeout, links)


TRANSPORTS: dict[str, Transport] = {row.name: row for row in (
    Transport("grpc", "one process per rank, each a gRPC server; messages over gRPC streams",
              process_ranks, grpc_rank, launchable=True),
    Transport("shm", "the gRPC processes; between ranks of one machine, messages' bytes through "
              "shared memory (comm/transports/shm)", process_ranks, shm_rank, launchable=True,
              scratch=shm_scratch),
    Transport("local", "one thread per rank in this process (comm/local.py): instant traces",
              thread_ranks),
)}


def transport(name: str, launch: bool = False) -> Transport:
    """The row of `name`; ValueError naming the valid ones (those a launch may use: `launch`)."""
    valid = [n for n, row in TRANSPORTS.items() if row.launchable or not launch]
    if not isinstance(name, str) or name not in valid:
        raise ValueError(f"unknown transport {name!r}; valid: {', '.join(valid)}")
    return TRANSPORTS[name]
