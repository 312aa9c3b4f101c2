"""`allreduce-edu launch` and `allreduce_edu.init()`: SPMD ranks, rendezvous, failures, and nothing left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import running

from allreduce_edu.collectives import ALGORITHMS, DESCRIPTIONS
from allreduce_edu.runtime.rendezvous import Rendezvous

ROOT = Path(__file__).resolve().parents[2]


def launch(*args, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "allreduce_edu.cli", "launch", *map(str, args)], cwd=ROOT, check=False,
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ, **(env or {})))


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "rank_script.py"
    path.write_text(textwrap.dedent(body))
    return path


def gone(pid: int) -> bool:
    return not running(pid)


@pytest.mark.processes
def test_launch_runs_the_demo_on_four_ranks():
    result = launch("-n", 4, "examples/allreduce_demo.py")
    assert result.returncode == 0, result.stderr
    for algorithm in [a for a in ALGORITHMS if DESCRIPTIONS[a].needs != "windows"]:  # gRPC ranks
        assert f"[rank 0] {algorithm:<20}" in result.stdout and "correct on all 4 ranks" in result.stdout
    assert sorted(line.split("]")[0] for line in result.stdout.splitlines() if line.endswith("done")) == \
        [f"[rank {r}" for r in range(4)]
    assert "at 127.0.0.1:" in result.stdout  # single node: loopback only


@pytest.mark.processes
def test_launch_with_an_ipv6_rendezvous(tmp_path):
    import socket
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
            port = s.getsockname()[1]
    except OSError:
        pytest.skip("this machine has no IPv6 loopback (::1)")
    body = """
        import numpy as np, allreduce_edu as ae
        comm = ae.init()
        print("sum", ae.allreduce(comm, np.ones(2)).tolist())
    """
    result = launch("-n", 2, "--rendezvous", f"[::1]:{port}", script(tmp_path, body))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("sum [2.0, 2.0]") == 2


@pytest.mark.processes
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="SIGKILLs a rank: POSIX only")
def test_a_rank_killed_while_it_holds_named_shared_memory_leaves_none_behind(tmp_path):
    """On the portable backend a segment is a named file until its receiver maps it; rank 0 makes
    one to fill (send_buffer), then is SIGKILLed before it sends: nobody else knows the name. The
    launcher, like a Cluster, sweeps the names it gave its ranks."""
    from allreduce_edu.comm.transports.shm.portable import PREFIX, scratch_base
    body = """
        import os, signal, numpy as np, allreduce_edu as ae
        comm = ae.init()
        comm.barrier()
        if comm.rank == 0:
            buffer = comm.send_buffer(1, (1 << 20,), np.float32)  # 4 MiB: a segment of its own
            print("holding", type(buffer).__name__, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        comm.recv(0, "never sent")
    """
    before = set(Path(scratch_base()).glob(PREFIX + "*"))
    result = launch("-n", 2, "--transport", "shm", "--timeout", 20, script(tmp_path, body),
                    env={"ALLREDUCE_EDU_SHM_BACKEND": "portable"})
    assert result.returncode != 0 and "[rank 0] holding" in result.stdout, result.stderr
    assert "rank 0 was killed by SIGKILL" in result.stderr
    assert set(Path(scratch_base()).glob(PREFIX + "*")) - before == set()


@pytest.mark.processes
def test_launch_over_shared_memory_reaches_every_local_peer_through_it(tmp_path):
    body = """
        import numpy as np, allreduce_edu as ae
        comm = ae.init()
        y = ae.allreduce(comm, np.full(1 << 20, comm.rank, np.float32), algorithm="ring")
        assert (y == 3).all()
        print("peers", comm.peers_on_shm(), sorted({e.via for e in comm.trace.events}))
    """
    result = launch("-n", 3, "--transport", "shm", script(tmp_path, body))
    assert result.returncode == 0, result.stderr
    for rank in range(3):
        assert f"[rank {rank}] peers {[r for r in range(3) if r != rank]} ['shm']" in result.stdout


@pytest.mark.processes
def test_a_failing_rank_stops_the_launch_and_leaves_nothing_running(tmp_path):
    body = """
        import os, signal, sys, time
        import numpy as np
        import allreduce_edu as ae
        comm = ae.init()
        open(os.path.join(sys.argv[1], f"pid{comm.rank}"), "w").write(str(os.getpid()))
        if comm.rank == 1:
            time.sleep(0.5)
            raise RuntimeError("rank 1 fails on purpose")
        if comm.rank == 2:  # deaf to SIGTERM: the launcher must SIGKILL it
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(600)
        ae.allreduce(comm, np.ones(4), algorithm="ring")  # waits for rank 1, which never sends
    """
    t0 = time.monotonic()
    result = launch("-n", 4, script(tmp_path, body), tmp_path)
    assert result.returncode != 0
    assert time.monotonic() - t0 < 60
    assert "rank 1 fails on purpose" in result.stderr and "exited with code 1" in result.stderr
    followers = [line for line in result.stderr.splitlines() if not line.startswith("[rank 1]")]
    assert not any("Traceback" in line for line in followers), result.stderr  # one line per other rank
    assert len(result.stderr.strip().splitlines()) <= 4 + 3 + 1, result.stderr
    pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(4)]
    assert all(gone(pid) for pid in pids), "a rank outlived its launcher"


@pytest.mark.processes
def test_ranks_exit_when_their_launcher_is_killed(tmp_path):
    body = """
        import os, sys, time
        import allreduce_edu as ae
        comm = ae.init()
        open(os.path.join(sys.argv[1], f"pid{comm.rank}"), "w").write(str(os.getpid()))
        time.sleep(600)
    """
    launcher = subprocess.Popen([sys.executable, "-m", "allreduce_edu.cli", "launch", "-n", "2",
                                 str(script(tmp_path, body)), str(tmp_path)], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("pid*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = [int(p.read_text()) for p in tmp_path.glob("pid*")]
        assert len(pids) == 2
    finally:
        launcher.kill()  # SIGKILL: the launcher gets no chance to stop them
        launcher.wait()
    deadline = time.monotonic() + 10
    while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(gone(pid) for pid in pids), "ranks outlived a killed launcher"


@pytest.mark.processes
def test_a_missing_rank_at_rendezvous_is_named_in_bounded_time(tmp_path):
    body = """
        import allreduce_edu as ae
        ae.init()
    """
    t0 = time.monotonic()  # node 0 of 2 starts; node 1 (ranks 2 and 3) never does
    result = launch("--nnodes", 2, "--node-rank", 0, "-n", 2, "--rendezvous", f"127.0.0.1:{_free_port()}",
                    "--rendezvous-timeout", 3,
                    script(tmp_path, body), env={"ALLREDUCE_EDU_TOKEN": "shared-secret"})
    assert result.returncode != 0
    assert time.monotonic() - t0 < 45
    for rank in (0, 1):  # rank 0 hosts the rendezvous, rank 1 waited in Join: both name the missing ranks
        assert any(line.startswith(f"[rank {rank}]") and "rank(s) 2, 3 did not join within 3 s" in line
                   for line in result.stderr.splitlines()), result.stderr


@pytest.mark.processes
def test_two_nodes_on_one_machine_share_a_token_file(tmp_path):
    body = """
        import numpy as np
        import allreduce_edu as ae
        comm = ae.init()
        n = comm.world_size
        x = np.arange(10, dtype=np.int64) * (comm.rank + 1)
        for algorithm in ("ring", "tree", "hierarchical"):
            y = ae.allreduce(comm, x, algorithm=algorithm)
            assert np.array_equal(y, np.arange(10) * n * (n + 1) // 2), (algorithm, y)
        print(f"rank {comm.rank} ok, ranks_per_node={comm.ranks_per_node}")
    """
    path = script(tmp_path, body)
    token = tmp_path / "token"
    token.write_text("a-shared-secret\n")
    port = _free_port()
    env = dict(os.environ, ALLREDUCE_EDU_TOKEN_FILE=str(token))
    env.pop("ALLREDUCE_EDU_TOKEN", None)
    nodes = [subprocess.Popen([sys.executable, "-m", "allreduce_edu.cli", "launch", "--nnodes", "2", "--node-rank",
                               str(k), "-n", "2", "--rendezvous", f"127.0.0.1:{port}", "--rendezvous-timeout", "30",
                               str(path)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in (1, 0)]  # node 1 first: its ranks wait for rank 0's rendezvous to come up
    outs = [node.communicate(timeout=120) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outs
    text = outs[0][0] + outs[1][0]
    assert all(f"rank {r} ok, ranks_per_node=2" in text for r in range(4)), text


@pytest.mark.processes
def test_several_nodes_need_a_shared_token(tmp_path):
    env = {k: "" for k in ("ALLREDUCE_EDU_TOKEN", "ALLREDUCE_EDU_TOKEN_FILE")}
    result = launch("--nnodes", 2, "--node-rank", 1, "-n", 1, "--rendezvous", "127.0.0.1:29500",
                    "examples/allreduce_demo.py", env=env)
    assert result.returncode == 2 and "ALLREDUCE_EDU_TOKEN" in result.stderr


@pytest.mark.processes
def test_a_script_run_alone_is_a_world_of_one(tmp_path):
    body = """
        import numpy as np
        import allreduce_edu as ae
        comm = ae.init()
        print(comm.world_size, ae.allreduce(comm, np.arange(3)).tolist())
    """
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    result = subprocess.run([sys.executable, str(script(tmp_path, body))], check=False, capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1 [0, 1, 2]"


def test_the_rendezvous_refuses_ranks_that_do_not_fit():
    rendezvous = Rendezvous(3, "127.0.0.1:1", timeout=0.1)
    rendezvous.arrive(0, 3, "127.0.0.1:1")
    with pytest.raises(ValueError, match="WORLD_SIZE=4"):
        rendezvous.arrive(1, 4, "127.0.0.1:2")
    with pytest.raises(ValueError, match="joined twice"):
        rendezvous.arrive(0, 3, "127.0.0.1:9")
    rendezvous.arrive(2, 3, "127.0.0.1:3")
    with pytest.raises(Exception, match=r"rank\(s\) 1 did not join") as error:
        rendezvous.table()
    assert error.value.ranks == (1,)


def test_join_dials_a_rank_0_that_is_not_ready_at_least_every_second():
    """A rank 0 still starting: here a socket that takes each connection and drops it. join keeps
    dialling within about a second of each try; on gRPC's default backoff (1 s, then 1.6x more a
    try) it dials 3 times in these 4 s, and a rank 0 ready at 17 s is asked at about 26 s."""
    import socket
    import threading
    from types import SimpleNamespace

    from allreduce_edu.comm.errors import RankFailure
    from allreduce_edu.runtime.rendezvous import join

    listener, dials, stop = socket.create_server(("127.0.0.1", 0)), [], threading.Event()
    listener.settimeout(0.05)

    def take_and_drop():
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                continue
            dials.append(time.monotonic())
            connection.close()

    taker = threading.Thread(target=take_and_drop, daemon=True)
    taker.start()
    comm = SimpleNamespace(rank=1, world_size=2, address="127.0.0.1:1", tls=None, metadata=())
    try:
        with pytest.raises(RankFailure, match="rendezvous at 127.0.0.1:.* did not answer"):
            join(comm, f"127.0.0.1:{listener.getsockname()[1]}", time.monotonic() + 4.0)
    finally:
        stop.set()
        taker.join(timeout=5)
        listener.close()
    assert len(dials) >= 5, f"join dialled {len(dials)} times in 4 s"


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.processes
@pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM to the launcher is TerminateProcess on "
                    "Windows, which it cannot catch: POSIX only")
def test_sigterm_to_the_launcher_stops_its_ranks(tmp_path):
    body = """
        import os, sys, time
        import allreduce_edu as ae
        comm = ae.init()
        open(os.path.join(sys.argv[1], f"pid{comm.rank}"), "w").write(str(os.getpid()))
        time.sleep(600)
    """
    launcher = subprocess.Popen([sys.executable, "-m", "allreduce_edu.cli", "launch", "-n", "2",
                                 str(script(tmp_path, body)), str(tmp_path)], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("pid*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int(p.read_text()) for p in tmp_path.glob("pid*")]
    launcher.send_signal(signal.SIGTERM)
    _, err = launcher.communicate(timeout=30)
    assert launcher.returncode != 0 and "interrupted" in err
    assert len(pids) == 2 and all(gone(pid) for pid in pids)


@pytest.mark.processes
@pytest.mark.parametrize("mutual", [False, True])
def test_launch_over_tls_with_the_rendezvous_behind_it_too(tmp_path, mutual):
    pytest.importorskip("cryptography")
    sys.path.insert(0, str(ROOT / "tests" / "comm"))  # run alone, the comm tests' folder is not on it
    from test_security import self_signed  # a certificate for 127.0.0.1, its own CA

    tls = self_signed()
    (tmp_path / "cert.pem").write_bytes(tls.cert)
    (tmp_path / "key.pem").write_bytes(tls.key)
    body = """
        import numpy as np
        import allreduce_edu as ae
        comm = ae.init()
        assert comm.tls is not None and comm.tls.mutual == (comm.rank >= 0 and {mutual})
        print("sum", ae.allreduce(comm, np.array([comm.rank + 1])).tolist())
    """.replace("{mutual}", str(mutual))
    flags = ["--tls-mutual"] if mutual else []
    result = launch("-n", 3, "--tls-cert", tmp_path / "cert.pem", "--tls-key", tmp_path / "key.pem", *flags,
                    script(tmp_path, body))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("sum [6]") == 3


@pytest.mark.processes
def test_a_node_with_another_token_is_refused_by_name(tmp_path):
    body = """
        import allreduce_edu as ae
        ae.init()
    """
    path, port = script(tmp_path, body), _free_port()
    nodes = [subprocess.Popen([sys.executable, "-m", "allreduce_edu.cli", "launch", "--nnodes", "2", "--node-rank",
                               str(k), "-n", "1", "--rendezvous", f"127.0.0.1:{port}", "--rendezvous-timeout", "4",
                               str(path)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, ALLREDUCE_EDU_TOKEN=f"token-of-node-{k}"))
             for k in (0, 1)]
    outs = [node.communicate(timeout=60) for node in nodes]
    assert all(node.returncode != 0 for node in nodes)
    assert "refused this rank's token" in outs[1][1]
    assert "rank(s) 1 did not join" in outs[0][1]
