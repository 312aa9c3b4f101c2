"""SPMD launch, as torchrun does it: `allreduce-edu launch -n 4 script.py`, and in the script `comm = init()`.

Every rank runs the same script. Rank 0's Rank server, bound at MASTER_ADDR:MASTER_PORT, also hosts
the rendezvous (the `Join` rpc): each rank tells it where it listens and gets back every rank's
address. Several machines: one launcher per machine, each with --nnodes, --node-rank and
--rendezvous HOST:PORT, and one shared token in ALLREDUCE_EDU_TOKEN (or ALLREDUCE_EDU_TOKEN_FILE).
The token travels in the environment, never on a command line (other users can read those).
"""

from __future__ import annotations

import atexit
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc

from ._proto import rank_pb2 as pb
from ._proto import rank_pb2_grpc
from .comm.errors import RankFailure
from .comm.grpc import CHANNEL_OPTIONS, TLS, GrpcCommunicator

ENV = "ALLREDUCE_EDU_"  # prefix of this package's variables; RANK, WORLD_SIZE, MASTER_ADDR, ... are torchrun's
MISSING_KEY = "x-allreduce-missing"  # trailing metadata of a failed Join: the ranks that never arrived
GRACE = 3.0  # seconds a rank gets to exit after SIGTERM before SIGKILL
_initialised = False


# --- in each rank: init() ------------------------------------------------------------------------
def init(timeout: float | None = None) -> GrpcCommunicator:
    """This process's rank, connected to every other rank of the launch (call it once per process).

    Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and LOCAL_WORLD_SIZE) as torchrun sets them; with
    none of them set, the script runs alone as a world of one.
    """
    global _initialised
    if _initialised:
        raise RuntimeError("allreduce_edu.init() was already called in this process; pass around the comm it returned")
    _initialised = True
    sys.setswitchinterval(2e-4)  # hand the GIL over often: gRPC threads and the algorithm share it
    env = os.environ
    rank, world_size = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    master = env.get("MASTER_ADDR", "127.0.0.1")
    port = int(env.get("MASTER_PORT", "0"))
    timeout = timeout or float(env.get(ENV + "TIMEOUT", "30"))
    rendezvous_timeout = float(env.get(ENV + "RENDEZVOUS_TIMEOUT", "60"))
    deadline = time.monotonic() + rendezvous_timeout
    token = read_token() or (secrets.token_hex(16) if world_size == 1 else "")
    if not token:
        raise RuntimeError(f"rank {rank}: no cluster token: the launcher sets {ENV}TOKEN; set it (or "
                           f"{ENV}TOKEN_FILE) to the same secret on every node")
    host = master if rank == 0 else env.get(ENV + "HOST") or local_address(master)
    try:
        comm = GrpcCommunicator(rank, world_size, token=token, host=host, port=port if rank == 0 else 0,
                                timeout=timeout, tls=_tls_from_env())
    except (OSError, RuntimeError) as e:
        raise RankFailure(f"rank {rank} cannot listen on {host}:{port if rank == 0 else 0} ({e}); "
                          f"is the port taken? choose another --rendezvous port", ranks=(rank,)) from None
    comm.ranks_per_node = int(env.get("LOCAL_WORLD_SIZE", world_size))  # the hierarchical all-reduce's nodes
    # at exit, before Python joins gRPC's server threads (which wait for the peers' streams to end)
    getattr(threading, "_register_atexit", atexit.register)(shutdown, comm)
    _watch_launcher()
    # rendezvous: rank 0 collects every rank's address, every other rank asks it for the table
    if world_size > 1:
        if rank == 0:
            comm.rendezvous = Rendezvous(world_size, f"{master}:{port}", rendezvous_timeout, deadline)
            comm.rendezvous.arrive(0, world_size, comm.address)
            addresses = comm.rendezvous.table(linger=2.0)  # on failure, let waiting Joins hear why first
        else:
            addresses = join(comm, f"{master}:{port}", deadline)
        comm.connect(addresses, timeout=max(deadline - time.monotonic(), 5.0))
    return comm


class Rendezvous:
    """Rank 0's side of the `Join` rpc: collect every rank's address, then hand everyone the table."""

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
                raise ValueError(f"rank {rank} was launched with WORLD_SIZE={world_size}, rank 0 with "
                                 f"{self.world_size}: every node needs the same --nnodes and -n")
            if not 0 <= rank < self.world_size:
                raise ValueError(f"rank {rank} is outside a world of {self.world_size}")
            if self.addresses.get(rank, address) != address:
                raise ValueError(f"rank {rank} joined twice ({self.addresses[rank]} and {address}): "
                                 f"two nodes share a --node-rank")
            self.addresses[rank] = address
            self._cond.notify_all()

    def missing(self) -> list[int]:
        return [r for r in range(self.world_size) if r not in self.addresses]

    def table(self, linger: float = 0.0) -> list[str]:
        """Every rank's address, once all have arrived; RankFailure naming the missing ones at the deadline
        (after up to `linger` seconds for the Joins still waiting to hear it)."""
        with self._cond:
            while self.missing() and self._cond.wait(max(self.deadline - time.monotonic(), 0)):
                pass
            missing = self.missing()
            if missing:
                self._cond.wait_for(lambda: self._serving == 0, timeout=linger)
                raise RankFailure(
                    f"rendezvous at {self.where}: rank(s) {', '.join(map(str, missing))} did not join within "
                    f"{self.timeout:g} s ({len(self.addresses)} of {self.world_size} arrived). Is every node's "
                    f"launcher running, with the same --nnodes, -n, --rendezvous and token?", ranks=tuple(missing))
            return [self.addresses[r] for r in range(self.world_size)]

    def __call__(self, request, context):
        """The Join handler: block until the table is complete, or abort naming the missing ranks."""
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
    tls = comm.tls
    channel = (grpc.secure_channel(where, tls.channel_credentials(), options=CHANNEL_OPTIONS) if tls
               else grpc.insecure_channel(where, options=CHANNEL_OPTIONS))
    request = pb.JoinRequest(rank=comm.rank, world_size=comm.world_size, address=comm.address)
    try:
        while (remaining := deadline - time.monotonic()) > 0:
            try:  # rank 0 answers by its own deadline; ours has a little slack so its answer arrives first
                return list(rank_pb2_grpc.RankStub(channel).Join(request, metadata=comm.metadata,
                                                                timeout=remaining + 5.0).addresses)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNAVAILABLE:  # rank 0 not listening yet
                    time.sleep(0.2)
                    continue
                if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                    raise RankFailure(f"rank {comm.rank}: rank 0 at {where} refused this rank's token; every node "
                                      f"needs the same {ENV}TOKEN (or {ENV}TOKEN_FILE)", ranks=(0,)) from None
                missing = dict(e.trailing_metadata() or ()).get(MISSING_KEY, "")
                raise RankFailure(f"rank {comm.rank}: {e.details()}",
                                  ranks=tuple(int(r) for r in missing.split(",") if r) or (0,)) from None
        raise RankFailure(f"rank {comm.rank}: rank 0's rendezvous at {where} did not answer before the deadline; "
                          f"is node 0's launcher running, and can this machine reach {where}?", ranks=(0,))
    finally:
        channel.close()


def shutdown(comm: GrpcCommunicator, timeout: float = 10.0) -> None:
    """Close the rank at exit, after every message it sent has reached its peer."""
    comm.close(drain=timeout)


def read_token() -> str:
    """The cluster token from ALLREDUCE_EDU_TOKEN, or the file ALLREDUCE_EDU_TOKEN_FILE names ("" if neither)."""
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
    return TLS(pem["cert"], pem["key"], pem.get("ca"), mutual=os.environ.get(ENV + "TLS_MUTUAL") == "1")


def local_address(towards: str) -> str:
    """The address of this machine that packets to `towards` leave from (no packet is sent)."""
    if towards in ("127.0.0.1", "localhost", "::1"):
        return "127.0.0.1"
    family, _, _, _, target = socket.getaddrinfo(towards, 9, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(target)  # UDP connect only picks a route
        return s.getsockname()[0]


def _watch_launcher() -> None:
    """Exit if the launcher that started this rank dies (so no rank outlives it)."""
    launcher = int(os.environ.get(ENV + "LAUNCHER_PID", "0"))

    def watch():
        while os.getppid() == launcher:
            time.sleep(0.5)
        os._exit(1)
    if launcher:
        threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


# --- on each node: the launcher --------------------------------------------------------------------
def launch(argv: list[str], nproc: int, nnodes: int = 1, node_rank: int = 0, rendezvous: str | None = None,
           host: str | None = None, timeout: float = 30.0, rendezvous_timeout: float = 60.0) -> int:
    """Run `python *argv` as ranks node_rank·nproc ... node_rank·nproc + nproc-1; 0 if all succeed, else the
    first failing rank's exit code (the other ranks are stopped at once)."""
    if nproc < 1 or nnodes < 1 or not 0 <= node_rank < nnodes:
        raise ValueError(f"need -n >= 1, --nnodes >= 1 and 0 <= --node-rank < --nnodes; got {nproc}, {nnodes}, "
                         f"{node_rank}")
    if nnodes > 1 and not rendezvous:
        raise ValueError("several nodes need --rendezvous HOST:PORT (node 0's address and a free port), "
                         "the same on every node")
    token = read_token()
    if nnodes > 1 and not token:
        raise ValueError(f"several nodes need one shared token: put the same secret in {ENV}TOKEN (or a file "
                         f"named by {ENV}TOKEN_FILE) on every node, e.g. `export {ENV}TOKEN=$(openssl rand -hex 16)`")
    master, _, port = (rendezvous or "").rpartition(":")
    master = master.strip("[]") or host or "127.0.0.1"
    if nnodes > 1 and not (port.isdigit() and int(port) > 0):
        raise ValueError(f"--rendezvous {rendezvous!r} needs a port, the same on every node, e.g. {master}:29500")
    port = int(port or 0) or _free_port(master)
    host = host or (master if node_rank == 0 else local_address(master))
    env = dict(os.environ, WORLD_SIZE=str(nnodes * nproc), LOCAL_WORLD_SIZE=str(nproc), NODE_RANK=str(node_rank),
               MASTER_ADDR=master, MASTER_PORT=str(port), PYTHONUNBUFFERED="1",
               **{ENV + "TOKEN": token or secrets.token_hex(16), ENV + "HOST": host, ENV + "TIMEOUT": str(timeout),
                  ENV + "RENDEZVOUS_TIMEOUT": str(rendezvous_timeout), ENV + "LAUNCHER_PID": str(os.getpid())})
    env.pop(ENV + "TOKEN_FILE", None)
    procs, pumps, lock = {}, [], threading.Lock()
    try:
        for local in range(nproc):  # start every local rank, its output prefixed with its rank
            rank = node_rank * nproc + local
            proc = procs[rank] = subprocess.Popen(
                [sys.executable, *argv], env=dict(env, RANK=str(rank), LOCAL_RANK=str(local)), stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)  # its own group: we stop it all
            pumps += [_pump(proc.stdout, sys.stdout, rank, lock), _pump(proc.stderr, sys.stderr, rank, lock)]
        return _watch(procs)  # until every rank succeeded, or the first one failed
    except KeyboardInterrupt:
        print(f"allreduce-edu launch: interrupted; stopping ranks {sorted(procs)}", file=sys.stderr)
        return 130
    finally:
        _stop(procs)
        for pump in pumps:
            pump.join(GRACE)


def _watch(procs: dict[int, subprocess.Popen]) -> int:
    while True:
        for rank, proc in procs.items():
            code = proc.poll()
            if code:
                how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
                others = [r for r, p in procs.items() if p.poll() is None]
                print(f"allreduce-edu launch: rank {rank} {how}; stopping rank(s) {others}" if others else
                      f"allreduce-edu launch: rank {rank} {how}", file=sys.stderr, flush=True)
                return code if 0 < code < 128 else 1
        if all(proc.poll() == 0 for proc in procs.values()):
            return 0
        time.sleep(0.05)


def _stop(procs: dict[int, subprocess.Popen]) -> None:
    """SIGTERM every rank's process group, then SIGKILL what is left after GRACE seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs.values():
            try:
                os.killpg(proc.pid, sig)  # the group outlives its leader while any member runs
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + GRACE
        for proc in procs.values():
            try:
                proc.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                pass
        if all(proc.poll() is not None for proc in procs.values()):
            return


def _pump(pipe, out, rank: int, lock: threading.Lock) -> threading.Thread:
    """Copy a rank's output line by line, each line whole and prefixed "[rank R] "."""
    def copy():
        for line in iter(pipe.readline, b""):
            with lock:
                out.write(f"[rank {rank}] {line.decode(errors='replace').rstrip()}\n")
                out.flush()
        pipe.close()
    thread = threading.Thread(target=copy, name=f"rank{rank}-output", daemon=True)
    thread.start()
    return thread


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def add_arguments(p) -> None:
    """The `allreduce-edu launch` options (torchrun's names where it has them)."""
    p.add_argument("-n", "--nproc-per-node", type=int, default=1, help="ranks on this node")
    p.add_argument("--nnodes", type=int, default=1, help="nodes (machines) in the launch")
    p.add_argument("--node-rank", type=int, default=0, help="this node's index, 0..nnodes-1")
    p.add_argument("--rendezvous", metavar="HOST:PORT", default=os.environ.get("MASTER_ADDR") and
                   f"{os.environ['MASTER_ADDR']}:{os.environ.get('MASTER_PORT', '29500')}",
                   help="where rank 0 listens (node 0's address); default: 127.0.0.1 and a free port")
    p.add_argument("--host", help="address this node's ranks listen on (default: the one that reaches the rendezvous)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds any wait for a peer may take")
    p.add_argument("--rendezvous-timeout", type=float, default=60.0, help="seconds to wait for every rank to join")
    p.add_argument("--tls-cert", help="PEM certificate chain (TLS between ranks; with --tls-key)")
    p.add_argument("--tls-key", help="PEM private key")
    p.add_argument("--tls-ca", help="PEM CA that signed the peers' certificates (default: --tls-cert)")
    p.add_argument("--tls-mutual", action="store_true", help="ranks also demand client certificates")
    p.add_argument("-m", "--module", action="store_true", help="run `script` as a module (python -m)")
    p.add_argument("script", help="the script every rank runs; it calls allreduce_edu.init()")
    p.add_argument("args", nargs="...", help="arguments for the script")


def run_from_args(args) -> int:
    """`allreduce-edu launch ...`: TLS files go to the ranks through the environment, like the token."""
    for key in ("cert", "key", "ca"):
        if getattr(args, f"tls_{key}"):
            os.environ[f"{ENV}TLS_{key.upper()}"] = os.path.abspath(getattr(args, f"tls_{key}"))
    if args.tls_mutual:
        os.environ[ENV + "TLS_MUTUAL"] = "1"
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` stops the ranks too, as Ctrl-C does
    return launch((["-m"] if args.module else []) + [args.script, *args.args], args.nproc_per_node, args.nnodes,
                  args.node_rank, args.rendezvous, args.host, args.timeout, args.rendezvous_timeout)
