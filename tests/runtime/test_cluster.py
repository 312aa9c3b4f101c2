"""The Cluster: real processes that stay up, fail loudly and fast, and leave nothing behind."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import HAS_PROC, KILLED, KILLED_CODE, cluster_for, needs_proc, running

import allreduce_edu as ae
from allreduce_edu.comm.errors import CollectiveAborted
from allreduce_edu.runtime.osfacts import HARD_KILL, die_now


def _whoami(comm, greeting):
    print(f"{greeting} from rank {comm.rank}")
    return comm.rank, comm.world_size, os.getpid()


@pytest.mark.processes
def test_ranks_are_separate_processes_that_stay_up():
    cluster = cluster_for("grpc", 3)
    first = cluster.run(_whoami, "hello")
    second = cluster.run(_whoami, "again")
    assert [r[:2] for r in first] == [(0, 3), (1, 3), (2, 3)]
    pids = {r[2] for r in first}
    assert len(pids) == 3 and os.getpid() not in pids
    assert {r[2] for r in second} == pids


def test_rank_output_is_printed_in_rank_order(capsys, transport):
    cluster_for(transport, 3).run(_whoami, "hi")
    assert capsys.readouterr().out.splitlines() == [f"[rank {r}] hi from rank {r}" for r in range(3)]


def _fails_on_rank_2(comm):
    if comm.rank == 2:
        raise KeyError("no such chunk")
    return ae.allreduce(comm, np.ones(3))


def test_a_user_exception_is_raised_with_its_rank_and_traceback(transport):
    cluster = cluster_for(transport, 4)
    with pytest.raises(KeyError, match="no such chunk") as info:
        cluster.run(_fails_on_rank_2)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "raised on rank 2" in notes
    if transport == "grpc":  # the remote traceback rides along as the cause
        assert "_fails_on_rank_2" in str(info.value.__cause__) and "raise KeyError" in str(info.value.__cause__)
    assert np.array_equal(cluster.run(lambda comm: ae.allreduce(comm, np.ones(2)))[3], [4.0, 4.0])


def _mismatched(comm, what):
    shape = (5,) if what == "shape" and comm.rank == 1 else (4,)
    dtype = np.float64 if what == "dtype" and comm.rank == 3 else np.float32
    return ae.allreduce(comm, np.ones(shape, dtype))


@pytest.mark.parametrize("what, odd_rank, words", [("shape", 1, ["shape=(5,)", "shape=(4,)"]),
                                                    ("dtype", 3, ["dtype=float64", "dtype=float32"])])
def test_mismatched_shapes_or_dtypes_raise_collective_mismatch_naming_the_ranks(transport, what, odd_rank, words):
    cluster = cluster_for(transport, 4)
    t0 = time.monotonic()
    with pytest.raises(ae.CollectiveMismatch) as info:
        cluster.run(_mismatched, what)
    assert time.monotonic() - t0 < 5, "a mismatch must surface at once, not at the deadline"
    message = str(info.value)
    assert f"rank {odd_rank} called" in message and all(w in message for w in words), message
    assert odd_rank in info.value.ranks and len(info.value.ranks) == 2
    notes = getattr(info.value, "__notes__", [])
    assert any("are involved" in note for note in notes), notes  # one message names every rank involved
    assert len(notes) <= 3 and not any("also raised CollectiveMismatch" in note for note in notes), notes
    cluster.run(_whoami, "still works")


@pytest.mark.processes
@needs_proc
def test_rank_processes_are_named_in_ps():
    cluster = cluster_for("grpc", 4)
    titles = [open(f"/proc/{p.pid}/cmdline", "rb").read().split(b"\0")[0].decode() for p in cluster._world.procs]
    assert titles == [f"allreduce-edu rank {r}/4 (cluster; parent pid {os.getpid()})" for r in range(4)]


def _killed_mid_collective(comm, victim):
    x = np.ones(1 << 16, np.float32)
    for i in range(1000):
        if comm.rank == victim and i == 3:
            die_now()
        x = ae.allreduce(comm, x, algorithm="ring") / comm.world_size
    return x


@pytest.mark.processes
def test_a_killed_rank_raises_rank_failure_naming_it_then_restart_gives_a_full_world(no_leftover_processes):
    with ae.Cluster(4, timeout=20) as cluster:
        addresses = cluster.addresses
        t0 = time.monotonic()
        with pytest.raises(ae.RankFailure) as info:
            cluster.run(_killed_mid_collective, 2)
        assert time.monotonic() - t0 < 10, "survivors must not sit out their 20 s deadline"
        assert re.search(rf"rank 2 died \({KILLED}\)", str(info.value)) and info.value.ranks == (2,)
        with pytest.raises(ae.RankFailure, match=r"call cluster.restart\(\)"):
            cluster.run(_whoami, "anyone?")
        cluster.restart()
        assert [r[0] for r in cluster.run(_whoami, "back")] == [0, 1, 2, 3]
        assert cluster.addresses != addresses
        addresses = cluster.addresses
    for address in addresses:  # closed: no rank listens any more
        host, port = address.rsplit(":", 1)
        with pytest.raises(OSError):
            socket.create_connection((host, int(port)), timeout=1).close()


def _stalls(comm):
    if comm.rank == 0:
        time.sleep(6)  # outside any collective, past everyone's deadline
    return ae.allreduce(comm, np.ones(2))


@pytest.mark.processes
def test_a_stalled_rank_times_out_naming_it_and_the_cluster_recovers(no_leftover_processes):
    with ae.Cluster(3, timeout=1.0) as cluster:
        t0 = time.monotonic()
        with pytest.raises(ae.CollectiveTimeout) as info:
            cluster.run(_stalls)
        assert time.monotonic() - t0 < 10  # 1 s deadline + 3 s grace + a restart, not the 6 s sleep and more
        assert str(info.value).startswith("rank 0 did not answer") and info.value.ranks == (0,)
        assert len(cluster.run(_whoami, "recovered")) == 3


def test_an_aborted_collective_leaves_no_stale_message_for_the_next_one(transport):
    cluster = cluster_for(transport, 4)
    with pytest.raises(KeyError):
        cluster.run(_fails_on_rank_2)  # ranks 0, 1, 3 sent messages that no one will receive
    for algorithm in cluster.run(lambda comm: ae.collectives.available(comm))[0]:
        ys = cluster.run(lambda comm, a: ae.allreduce(comm, np.full(3, comm.rank + 1.0), algorithm=a), algorithm)
        assert all(np.array_equal(y, [10.0, 10.0, 10.0]) for y in ys), algorithm


@pytest.mark.processes
def test_close_ends_every_process_and_is_idempotent(no_leftover_processes):
    cluster = ae.Cluster(2)
    pids = [r[2] for r in cluster.run(_whoami, "bye")]
    cluster.close()
    cluster.close()
    assert cluster.closed
    assert not [pid for pid in pids if running(pid)]
    with pytest.raises(RuntimeError, match="closed"):
        cluster.run(_whoami, "hello?")


@pytest.mark.processes
def test_a_rank_that_cannot_start_says_why(no_leftover_processes):
    """An address this machine does not have (TEST-NET-1): no rank's gRPC server can bind, and the
    caller reads which rank failed and why, not only an exit code."""
    with pytest.raises(ae.RankFailure, match=r"rank \d failed to start: RuntimeError: .*bind"), \
            pytest.warns(UserWarning, match="without TLS"):
        ae.Cluster(2, host="192.0.2.1")


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.processes
@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
def test_an_ipv6_host_works_with_or_without_its_brackets():
    for host in ("::1", "[::1]"):  # gRPC's HOST:PORT needs the brackets: the package adds them
        with ae.Cluster(2, host=host) as cluster:
            got = cluster.run(lambda comm: (comm.address.startswith("[::1]:"),
                                            ae.allreduce(comm, np.ones(2)).tolist()))
            assert got == [(True, [2.0, 2.0])] * 2


@pytest.mark.processes
def test_ranks_started_before_an_interrupted_spawn_are_stopped(monkeypatch, no_leftover_processes):
    from allreduce_edu.runtime import processes
    real, spawned = processes.started, []

    def started(proc):  # Ctrl-C while the second of three ranks starts
        spawned.append(proc)
        if len(spawned) == 2:
            raise KeyboardInterrupt
        real(proc)

    monkeypatch.setattr(processes, "started", started)
    with pytest.raises(KeyboardInterrupt, match="every one was stopped"):
        ae.Cluster(3)
    assert not spawned[0].is_alive() and spawned[0].exitcode is not None


@pytest.mark.processes
def test_an_interrupt_while_the_call_is_handed_out_stops_the_ranks_that_got_it(monkeypatch):
    from allreduce_edu.runtime.shipping import ship
    with ae.Cluster(2, timeout=30) as cluster:
        world = cluster._world

        def half_then_ctrl_c(run_id, fn, args, kwargs):  # rank 0 has the call, rank 1 not yet
            world.conns[0].send(("run", (run_id, run_id, ship(fn, args, kwargs))))
            raise KeyboardInterrupt

        monkeypatch.setattr(world, "submit", half_then_ctrl_c)
        with pytest.raises(KeyboardInterrupt, match="interrupted while the call was handed .* replaced"):
            cluster.run(lambda comm: ae.allreduce(comm, np.ones(2)))
        monkeypatch.undo()
        assert [r.tolist() for r in cluster.run(lambda comm: ae.allreduce(comm, np.ones(2)))] == [[2.0, 2.0]] * 2


@pytest.mark.parametrize("kwargs, words", [({"world_size": 0}, "world_size"), ({"world_size": 2.5}, "world_size"),
                                           ({"transport": "carrier-pigeon"}, "grpc, shm, local"),
                                           ({"timeout": 0}, "timeout")])
def test_bad_cluster_arguments(kwargs, words):
    with pytest.raises(ValueError, match=words):
        ae.Cluster(**kwargs)


@pytest.mark.processes
def test_a_script_without_a_main_guard_gets_an_explanation(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text("import allreduce_edu\ncluster = allreduce_edu.Cluster(2)\ncluster.close()\n")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert 'if __name__ == "__main__":' in result.stderr and "EOFError" not in result.stderr.splitlines()[-1]


@pytest.mark.processes
def test_a_script_with_a_main_guard_works(tmp_path):
    script = tmp_path / "guarded.py"
    script.write_text(textwrap.dedent("""
        import numpy as np, allreduce_edu
        def main(comm):
            return allreduce_edu.allreduce(comm, np.ones(3) * comm.rank)
        if __name__ == "__main__":
            with allreduce_edu.Cluster(3) as cluster:
                print(cluster.run(main)[0].tolist())
    """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[3.0, 3.0, 3.0]"


@pytest.mark.processes
def test_a_module_beside_the_notebook_runs_on_the_ranks(tmp_path, monkeypatch):
    (tmp_path / "my_ring.py").write_text("def double(comm, x):\n    return 2 * x + comm.rank\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # the ranks started earlier cannot import it: it ships by value
    import my_ring
    assert cluster_for("grpc", 2).run(my_ring.double, 5) == [10, 11]


@pytest.mark.processes
def test_the_parent_dying_takes_its_ranks_with_it(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time, allreduce_edu
        if __name__ == "__main__":
            cluster = allreduce_edu.Cluster(2)
            print(" ".join(str(r) for r in cluster.run(lambda comm: os.getpid())), flush=True)
            time.sleep(60)
    """))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        alive = pids
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if _alive(p)]
            time.sleep(0.1)
        assert not alive, f"orphaned ranks {alive} outlived their parent"
    finally:
        parent.kill()


def _alive(pid: int) -> bool:
    if not running(pid):
        return False
    if not HAS_PROC:  # cannot tell a zombie: it counts as alive until it is reaped
        return True
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"  # a zombie is dead, just not yet reaped


def test_aborted_is_a_collective_error():
    assert issubclass(CollectiveAborted, ae.CollectiveError)
    for cls in (ae.RankFailure, ae.CollectiveTimeout, ae.CollectiveMismatch):
        assert issubclass(cls, ae.CollectiveError)


def _bad_tag(comm, tag, step):
    if comm.rank == 0:
        comm.send(1, np.ones(2), tag, step=step)


@pytest.mark.parametrize("tag, step, error", [(7, -1, TypeError), ("ok", 1 << 20, ValueError)])
def test_a_bad_tag_or_step_is_refused_before_sending_and_the_link_survives(transport, tag, step, error):
    cluster = cluster_for(transport, 2)
    with pytest.raises(error, match="rank 0"):
        cluster.run(_bad_tag, tag, step)
    assert [r[0] for r in cluster.run(_whoami, "link still fine")] == [0, 1]


def _wait_for(comm, timeout):
    if comm.rank == 0:
        comm.recv(1, "never", timeout=timeout)


@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), -1.0, "5"])
def test_a_timeout_that_is_no_number_of_seconds_is_refused_naming_the_rank(transport, timeout):
    cluster = cluster_for(transport, 2)
    with pytest.raises(ValueError, match=r"rank 0: timeout=.* is not a number of seconds"):
        cluster.run(_wait_for, timeout)  # inf overflowed the wait; -1 timed out at once, unexplained


def _threads_send_at_once(comm, threads, count):
    import threading
    if comm.rank == 0:
        def sender(t):
            for i in range(count):
                comm.send(1, np.array([t, i]), f"thread{t}")
        workers = [threading.Thread(target=sender, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return None
    return [[comm.recv(0, f"thread{t}")[1] for _ in range(count)] for t in range(threads)]


@pytest.mark.processes
def test_sends_from_several_threads_arrive_in_order():
    received = cluster_for("grpc", 2).run(_threads_send_at_once, 6, 300)[1]
    assert received == [list(range(300))] * 6


class ChunkError(Exception):
    """An exception class of the learner's own, defined beside their code."""


def _raises_own_class(comm):
    if comm.rank == 1:
        raise ChunkError("chunk 3 is missing")
    return comm.rank


def test_an_exception_of_the_learners_own_class_comes_back_whole(transport):
    with pytest.raises(Exception, match="chunk 3 is missing") as info:
        cluster_for(transport, 2).run(_raises_own_class)
    assert type(info.value).__name__ == "ChunkError"


@pytest.mark.processes
def test_a_rank_killed_while_idle_is_named_at_the_next_run(no_leftover_processes):
    with ae.Cluster(3) as cluster:
        pid = cluster.run(_whoami, "hi")[2][2]
        os.kill(pid, HARD_KILL)
        time.sleep(0.5)
        with pytest.raises(ae.RankFailure, match=rf"rank 2 \(exit code {KILLED_CODE}\) died while idle") as info:
            cluster.run(_whoami, "anyone?")
        assert info.value.ranks == (2,)
        with pytest.raises(ae.RankFailure, match="restart"):
            cluster.run(_whoami, "still?")
        cluster.restart()
        assert len(cluster.run(_whoami, "back")) == 3
