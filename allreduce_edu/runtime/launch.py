"""SPMD launch, as torchrun does it: `allreduce-edu launch -n 4 script.py`,
and in the script `comm = init()`.

Every rank runs the same script (runtime/rendezvous.py is its side). Several machines: one launcher
per machine, each with --nnodes, --node-rank and --rendezvous HOST:PORT, and one shared token in
ALLREDUCE_EDU_TOKEN (or ALLREDUCE_EDU_TOKEN_FILE). The token travels in the environment, never on a
command line (other users can read those).
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time

from ..comm.transports.grpc.communicator import target
from .osfacts import new_group, signal_name, stop_group
from .rendezvous import ENV, local_address, read_token
from .rules import check, in_the_clear
from .transports import TRANSPORTS
from .worker import GRACE


def _checked(nproc: int, nnodes: int, node_rank: int, rendezvous: str | None, host: str | None):
    """(token, rendezvous host, port text) for a launch; ValueError naming what is wrong with it."""
    if nproc < 1 or nnodes < 1 or not 0 <= node_rank < nnodes:
        raise ValueError(f"need -n >= 1, --nnodes >= 1 and 0 <= --node-rank < --nnodes; "
                         f"got {nproc}, {nnodes}, {node_rank}")
    if nnodes > 1 and not rendezvous:
        raise ValueError("several nodes need --rendezvous HOST:PORT "
                         "(node 0's address and a free port), the same on every node")
    token = read_token()
    if nnodes > 1 and not token:
        raise ValueError(f"several nodes need one shared token: put the same secret in {ENV}TOKEN "
                         f"(or a file named by {ENV}TOKEN_FILE) on every node, "
                         f"e.g. `export {ENV}TOKEN=$(openssl rand -hex 16)`")
    if host is not None:
        check("--host", host)
    if rendezvous:
        master, number = check("--rendezvous", rendezvous)
        master, port = master or host or "127.0.0.1", str(number or "")
    else:
        master, port = host or "127.0.0.1", ""
    if nnodes > 1 and not port:
        raise ValueError(f"--rendezvous {rendezvous!r} needs a port, the same on every node, "
                         f"e.g. {target(master, 29500)}")
    return token, master, port


def check_arguments(args) -> None:
    """ValueError, before anything starts, for `allreduce-edu launch` options that cannot work."""
    _checked(args.nproc_per_node, args.nnodes, args.node_rank, args.rendezvous, args.host)
    check("--timeout", args.timeout)
    check("--rendezvous-timeout", args.rendezvous_timeout)
    if not args.module and not os.path.isfile(args.script):
        raise ValueError(f"no script {args.script!r} here: give the path of the file every rank "
                         f"runs (or -m and a module)")


def launch(argv: list[str], nproc: int, nnodes: int = 1, node_rank: int = 0,
           rendezvous: str | None = None, host: str | None = None, timeout: float = 30.0,
           rendezvous_timeout: float = 60.0, transport: str = "grpc") -> int:
    """Run `python *argv` as ranks node_rank·nproc ... node_rank·nproc + nproc-1; 0 if all succeed,
    else the first failing rank's exit code (the other ranks are stopped at once)."""
    token, master, port = _checked(nproc, nnodes, node_rank, rendezvous, host)
    timeout = check("--timeout", timeout)
    rendezvous_timeout = check("--rendezvous-timeout", rendezvous_timeout)
    port = int(port or 0) or _free_port(master)
    host = host or (master if node_rank == 0 else local_address(master))
    exposed = in_the_clear(host, os.environ.get(ENV + "TLS_CERT"))  # where this node's ranks listen
    if exposed:
        print(f"allreduce-edu launch: {exposed}", file=sys.stderr)
    env = dict(os.environ, WORLD_SIZE=str(nnodes * nproc), LOCAL_WORLD_SIZE=str(nproc),
               NODE_RANK=str(node_rank), MASTER_ADDR=master, MASTER_PORT=str(port),
               PYTHONUNBUFFERED="1", **{ENV + "TOKEN": token or secrets.token_hex(16),
                                        ENV + "HOST": host, ENV + "TIMEOUT": str(timeout),
                                        ENV + "RENDEZVOUS_TIMEOUT": str(rendezvous_timeout),
                                        ENV + "TRANSPORT": transport,
                                        ENV + "LAUNCHER_PID": str(os.getpid())})
    env.pop(ENV + "TOKEN_FILE", None)
    row = TRANSPORTS.get(transport)
    # the names of this node's shared memory, if it has names: swept below, whatever ranks did
    scratch = row.scratch() if row is not None and row.scratch else None
    if scratch is not None:
        env[ENV + "SHM_PREFIX"] = scratch.prefix
    procs, pumps, lock = {}, [], threading.Lock()
    try:
        for local in range(nproc):  # start every local rank, its output prefixed with its rank
            rank = node_rank * nproc + local
            proc = procs[rank] = subprocess.Popen(
                [sys.executable, *argv], env=dict(env, RANK=str(rank), LOCAL_RANK=str(local)),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                **new_group())  # its own group: we stop it all
            pumps += [_pump(proc.stdout, sys.stdout, rank, lock),
                      _pump(proc.stderr, sys.stderr, rank, lock)]
        return _watch(procs)  # until every rank succeeded, or the first one failed
    except KeyboardInterrupt:
        print(f"allreduce-edu launch: interrupted; stopping ranks {sorted(procs)}", file=sys.stderr)
        return 130
    finally:
        _stop(procs)
        for pump in pumps:
            pump.join(GRACE)
        if scratch is not None:
            scratch.sweep()


def _watch(procs: dict[int, subprocess.Popen]) -> int:
    while True:
        for rank, proc in procs.items():
            code = proc.poll()
            if code:
                how = (f"was killed by {signal_name(code)}" if signal_name(code)
                       else f"exited with code {code}")
                others = [r for r, p in procs.items() if p.poll() is None]
                print(f"allreduce-edu launch: rank {rank} {how}; stopping rank(s) {others}"
                      if others else f"allreduce-edu launch: rank {rank} {how}",
                      file=sys.stderr, flush=True)
                return code if 0 < code < 128 else 1
        if all(proc.poll() == 0 for proc in procs.values()):
            return 0
        time.sleep(0.05)


def _stop(procs: dict[int, subprocess.Popen]) -> None:
    """Ask every rank's process group to stop, then kill what is left after GRACE seconds."""
    for hard in (False, True):
        for proc in procs.values():
            stop_group(proc, hard)
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
                   help="where rank 0 listens (node 0's address); "
                        "default: 127.0.0.1 and a free port")
    p.add_argument("--host", help="address this node's ranks listen on "
                                  "(default: the one that reaches the rendezvous)")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds any wait for a peer may take")
    p.add_argument("--rendezvous-timeout", type=float, default=60.0,
                   help="seconds to wait for every rank to join")
    p.add_argument("--transport", default="grpc",
                   choices=[name for name, row in TRANSPORTS.items() if row.launchable],
                   help="shm: ranks on one machine send their bytes through shared memory "
                        "(gRPC between machines and for control); default grpc")
    p.add_argument("--tls-cert", help="PEM certificate chain (TLS between ranks; with --tls-key)")
    p.add_argument("--tls-key", help="PEM private key")
    p.add_argument("--tls-ca",
                   help="PEM CA that signed the peers' certificates (default: --tls-cert)")
    p.add_argument("--tls-mutual", action="store_true",
                   help="ranks also demand client certificates")
    p.add_argument("-m", "--module", action="store_true",
                   help="run `script` as a module (python -m)")
    p.add_argument("script", help="the script every rank runs; it calls allreduce_edu.init()")
    p.add_argument("args", nargs="...", help="arguments for the script")


def run_from_args(args) -> int:
    """`allreduce-edu launch ...`:
    TLS files go to the ranks through the environment, like the token."""
    for key in ("cert", "key", "ca"):
        if getattr(args, f"tls_{key}"):
            os.environ[f"{ENV}TLS_{key.upper()}"] = os.path.abspath(getattr(args, f"tls_{key}"))
    if args.tls_mutual:
        os.environ[ENV + "TLS_MUTUAL"] = "1"
    # `kill` (Windows: Ctrl-Break, osfacts.stop_group) stops the ranks too, as Ctrl-C does
    for name in ("SIGTERM", "SIGBREAK"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.default_int_handler)
    return launch((["-m"] if args.module else []) + [args.script, *args.args], args.nproc_per_node,
                  args.nnodes, args.node_rank, args.rendezvous, args.host, args.timeout,
                  args.rendezvous_timeout, args.transport)
