"""The rank side of an SPMD launch: `comm = init()` in every rank's script,
meeting at rank 0's rendezvous.

Rank 0's Rank server, bound at MASTER_ADDR:MASTER_PORT, also hosts the rendezvous (the `Join` rpc):
each rank tells it where it listens and gets back every rank's address.
The token travels in the environment (ALLREDUCE_EDU_TOKEN, or a file ALLREDUCE_EDU_TOKEN_FILE
names), never on a command line.
"""

from __future__ import annotations

import atexit
import os
import secrets
import socket
import sys
import threading
import time
import traceback

import grpc

from .._proto import rank_pb2 as pb
from .._proto import rank_pb2_grpc
from ..comm.auth import TLS, channel
from ..comm.errors import CollectiveError, RankFailure
from ..comm.transports.grpc.communicator import GrpcCommunicator, target
from ..comm.transports.shm.portable import Scratch
from .transports import transport as transport_row
from .worker import become_rank

# prefix of this package's variables; RANK, WORLD_SIZE, MASTER_ADDR, ... are torchrun's
ENV = "ALLREDUCE_EDU_"
# trailing metadata of a failed Join: the ranks that never arrived
MISSING_KEY = "x-allreduce-missing"
_initialised = False


def init(timeout: float | None = None) -> GrpcCommunicator:
    """This process's rank, connected to every other rank of the launch (call it once per process).

    Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and LOCAL_WORLD_SIZE) as torchrun sets them;
    with none of them set, the script runs alone as a world of one. ALLREDUCE_EDU_TRANSPORT=shm
    (`launch --transport shm`) sends to ranks on the same machine through shared memory.
    """
    global _initialised
    if _initialised:
        raise RuntimeError("allreduce_edu.init() was already called in this process; "
                           "pass around the comm it returned")
    _initialised = True
    env = os.environ
    rank, world_size = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    master = env.get("MASTER_ADDR", "127.0.0.1")
    port = int(env.get("MASTER_PORT", "0"))
    timeout = timeout or float(env.get(ENV + "TIMEOUT", "30"))
    rendezvous_timeout = float(env.get(ENV + "RENDEZVOUS_TIMEOUT", "60"))
    deadline = time.monotonic() + rendezvous_timeout
    token = read_token() or (secrets.token_hex(16) if world_size == 1 else "")
    if not token:
        raise RuntimeError(f"rank {rank}: no cluster token: the launcher sets {ENV}TOKEN; "
                           f"set it (or {ENV}TOKEN_FILE) to the same secret on every node")
    host = master if rank == 0 else env.get(ENV + "HOST") or local_address(master)
    try:  # the transport's row (runtime/transports.py): how this rank builds its communicator
        row = transport_row(env.get(ENV + "TRANSPORT", "grpc"), launch=True)
    except ValueError as e:
        raise ValueError(f"{ENV}TRANSPORT: {e}") from None
    try:
        comm = row.communicator(rank, world_size, token=token, host=host,
                                port=port if rank == 0 else 0, timeout=timeout, tls=_tls_from_env(),
                                scratch=_scratch_from_env(env))
    except (OSError, RuntimeError) as e:
        raise RankFailure(f"rank {rank} cannot listen on {target(host, port if rank == 0 else 0)} "
                          f"({e}); "
                          f"is the port taken? choose another --rendezvous port",
                          ranks=(rank,)) from None
    # the hierarchical all-reduce's nodes
    comm.ranks_per_node = int(env.get("LOCAL_WORLD_SIZE", world_size))
    # at exit, before Python joins gRPC's server threads (which wait for the peers' streams to end)
    getattr(threading, "_register_atexit", atexit.register)(shutdown, comm)
    launcher = int(env.get(ENV + "LAUNCHER_PID", "0")) or None
    if launcher or world_size > 1:  # a script run alone stays the user's own process
        become_rank(rank, world_size, launcher, "launch", interruptible=True,
                    sharing=int(env.get("LOCAL_WORLD_SIZE", world_size)))
        sys.excepthook = _brief_collective_errors(sys.excepthook)
    # rendezvous: rank 0 collects every rank's address, every other rank asks it for the table
    if world_size > 1:
        if rank == 0:
            comm.rendezvous = Rendezvous(world_size, target(master, port), rendezvous_timeout,
                                         deadline)
            comm.rendezvous.arrive(0, world_size, comm.address)
            # on failure, let waiting Joins hear why first
            addresses = comm.rendezvous.table(linger=2.0)
        else:
            addresses = join(comm, target(master, port), deadline)
        comm.connect(addresses, timeout=max(deadline - time.monotonic(), 5.0))
    return comm


class Rendezvous:
    """Rank 0's side of the `Join` rpc:
    collect every rank's address, then hand everyone the table."""

    def __init__(self, world_size: int, where: str, timeout: float, deadline: float | None = None):
        self.world_size, self.where, self.timeout = world_size, where, timeout
        self.deadline = deadline or time.monotonic() + timeout
        self.addresses: dict[int, str] = {}
        self._cond = threading.Condition()
        self._serving = 0  # Join calls still answering

    def arrive(self, rank: int, world_size: int, address: str) -> None:
        """Record a rank's address; ValueError when it does not fit this world."""
        with self._cond:
            if world_size != self.world_size:
                raise ValueError(f"rank {rank} was launched with WORLD_SIZE={world_size}, "
                                 f"rank 0 with {self.world_size}: "
                                 f"every node needs the same --nnodes and -n")
            if not 0 <= rank < self.world_size:
                raise ValueError(f"rank {rank} is outside a world of {self.world_size}")
            if self.addresses.get(rank, address) != address:
                raise ValueError(f"rank {rank} joined twice ({self.addresses[rank]} and "
                                 f"{address}): two nodes share a --node-rank")
            self.addresses[rank] = address
            self._cond.notify_all()

    def missing(self) -> list[int]:
        return [r for r in range(self.world_size) if r not in self.addresses]

    def table(self, linger: float = 0.0) -> list[str]:
        """Every rank's address, once all have arrived; RankFailure naming the missing ones at the
        deadline (after up to `linger` seconds for the Joins still waiting to hear it)."""
        with self._cond:
            while self.missing() and self._cond.wait(max(self.deadline - time.monotonic(), 0)):
                pass
            missing = self.missing()
            if missing:
                self._cond.wait_for(lambda: self._serving == 0, timeout=linger)
                raise RankFailure(
                    f"rendezvous at {self.where}: rank(s) {', '.join(map(str, missing))} "
                    f"did not join within {self.timeout:g} s "
                    f"({len(self.addresses)} of {self.world_size} arrived). Is every node's "
                    f"launcher running, with the same --nnodes, -n, --rendezvous and token?",
                    ranks=tuple(missing))
            return [self.addresses[r] for r in range(self.world_size)]

    def __call__(self, request, context):
        """The Join handler: block until the table is complete,
        or abort naming the missing ranks."""
        with self._cond:
            self._serving += 1
        try:
            try:
                self.arrive(request.rank, request.world_size, request.address)
                return pb.JoinReply(addresses=self.table())
            except ValueError as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            except RankFailure as e:
                context.set_trailing_metadata(((MISSING_KEY, ",".join(map(str, e.ranks))),))
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(e))
        finally:
            with self._cond:
                self._serving -= 1
                self._cond.notify_all()


def join(comm: GrpcCommunicator, where: str, deadline: float) -> list[str]:
    """Ask rank 0's rendezvous at `where` for every rank's address (retrying until rank 0 is up)."""
    to_rank0 = channel(where, comm.tls)
    request = pb.JoinRequest(rank=comm.rank, world_size=comm.world_size, address=comm.address)
    try:
        while (remaining := deadline - time.monotonic()) > 0:
            # rank 0 answers by its own deadline; ours has some slack so its answer arrives first
            try:
                return list(rank_pb2_grpc.RankStub(to_rank0).Join(request, metadata=comm.metadata,
                                                                timeout=remaining + 5.0).addresses)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNAVAILABLE:  # rank 0 not listening yet
                    time.sleep(0.2)
                    continue
                if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                    raise RankFailure(f"rank {comm.rank}: rank 0 at {where} refused this rank's "
                                      f"token; every node needs the same {ENV}TOKEN "
                                      f"(or {ENV}TOKEN_FILE)", ranks=(0,)) from None
                missing = dict(e.trailing_metadata() or ()).get(MISSING_KEY, "")
                ranks = tuple(int(r) for r in missing.split(",") if r) or (0,)
                raise RankFailure(f"rank {comm.rank}: {e.details()}", ranks=ranks) from None
        raise RankFailure(f"rank {comm.rank}: rank 0's rendezvous at {where} did not answer "
                          f"before the deadline; "
                          f"is node 0's launcher running, and can this machine reach {where}?",
                          ranks=(0,))
    finally:
        to_rank0.close()


def shutdown(comm: GrpcCommunicator, timeout: float = 10.0) -> None:
    """Close the rank at exit, after every message it sent has reached its peer."""
    comm.close(drain=timeout)


def read_token() -> str:
    """The cluster token from ALLREDUCE_EDU_TOKEN, or the file ALLREDUCE_EDU_TOKEN_FILE names
    ("" if neither)."""
    if os.environ.get(ENV + "TOKEN"):
        return os.environ[ENV + "TOKEN"]
    path = os.environ.get(ENV + "TOKEN_FILE")
    if path:
        with open(path) as f:
            return f.read().strip()
    return ""


def _tls_from_env() -> TLS | None:
    paths = {k: os.environ.get(ENV + "TLS_" + k.upper()) for k in ("cert", "key", "ca")}
    if not paths["cert"]:
        return None
    pem = {}
    for key, path in paths.items():
        if path:
            with open(path, "rb") as f:
                pem[key] = f.read()
    return TLS(pem["cert"], pem["key"], pem.get("ca"),
               mutual=os.environ.get(ENV + "TLS_MUTUAL") == "1")


def _scratch_from_env(env) -> Scratch | None:
    """The launcher's names for this node's shared memory (it sweeps them when the ranks end);
    None: the rank makes its own (run alone, or by another launcher)."""
    prefix = env.get(ENV + "SHM_PREFIX")
    try:
        return Scratch(prefix) if prefix else None
    except ValueError as e:
        raise ValueError(f"{ENV}SHM_PREFIX: {e}") from None


def local_address(towards: str) -> str:
    """The address of this machine that packets to `towards` leave from (no packet is sent)."""
    towards = towards.strip("[]")
    if towards in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    family, _, _, _, target = socket.getaddrinfo(towards, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(target)  # UDP connect only picks a route
        return s.getsockname()[0]


def _brief_collective_errors(hook):
    """An excepthook for launched ranks: a collective that failed (a dead peer, a stopped, late or
    mismatched collective) is one line and the place in the script that called it; any other
    error, the script's own, shows its whole traceback."""
    def excepthook(kind, error, tb):
        if not isinstance(error, CollectiveError):
            return hook(kind, error, tb)
        frames = [f for f in traceback.extract_tb(tb) if "allreduce_edu" not in f.filename]
        where = f" (at {frames[-1].filename}, line {frames[-1].lineno})" if frames else ""
        print(f"{kind.__name__}: {str(error).splitlines()[0]}{where}", file=sys.stderr, flush=True)
    return excepthook
