"""`allreduce-edu demo` and `allreduce-edu bench`, run as a learner would run them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from allreduce_edu.bench import allreduce as bench
from allreduce_edu.collectives import ALGORITHMS, DESCRIPTIONS


def cli(*args, timeout=240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "allreduce_edu.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.processes
def test_demo_checks_every_algorithm_against_numpy():
    result = cli("demo", "-n", "3", "--count", "1001")
    assert result.returncode == 0, result.stderr
    over_grpc = [a for a in ALGORITHMS if DESCRIPTIONS[a].needs != "windows"]  # not one_shot, two_shot
    rows = [line.split() for line in result.stdout.splitlines() if line.split() and line.split()[0] in ALGORITHMS]
    assert [r[0] for r in rows] == over_grpc
    assert all(r[-1] == "yes" for r in rows), result.stdout
    lines = result.stdout.splitlines()
    assert lines[0].startswith("3 ranks over grpc") and lines[1].split()[:2] == ["algorithm", "steps"]
    assert [line.split()[0] for line in lines[2:]] == over_grpc  # the header, then only rows


@pytest.mark.processes
def test_bench_prints_nccl_tests_columns_and_writes_json(tmp_path):
    out = tmp_path / "rows.json"
    result = cli("bench", "-n", "2", "--algorithm", "ring,tree", "-b", "8", "-e", "4K", "-f", "8",
                 "--iters", "3", "--warmup", "1", "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "latency alpha" in result.stdout and "bandwidth 1/beta" in result.stdout
    assert "algbw" in result.stdout and "busbw" in result.stdout and "#wrong" in result.stdout
    rows = json.loads(out.read_text())
    assert [(r["algorithm"], r["bytes"]) for r in rows] == [(a, b) for a in ("ring", "tree") for b in (8, 64, 512, 4096)]
    assert set(rows[0]) == {"algorithm", "world_size", "bytes", "count", "dtype", "time_us", "algbw_gbps",
                            "busbw_gbps", "wrong"}
    for r in rows:
        assert r["wrong"] == 0 and r["time_us"] > 0 and r["count"] == r["bytes"] // 4
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * (2 - 1) / 2)


@pytest.mark.processes
def test_bench_rejects_unknown_algorithms():
    result = cli("bench", "--algorithm", "ring,telepathy")
    assert result.returncode == 2 and "telepathy" in result.stderr and "rabenseifner" in result.stderr


def test_wrong_results_make_the_bench_fail(monkeypatch):
    monkeypatch.setattr(bench, "expected", lambda n, count, dtype: bench.pattern(0, count, dtype))  # a wrong oracle
    from allreduce_edu import cli as cli_module
    assert cli_module.main(["bench", "-n", "2", "--transport", "local", "--algorithm", "ring", "-b", "64",
                            "-e", "64", "--iters", "1", "--warmup", "0"]) == 1


@pytest.mark.parametrize("text, size", [("8", 8), ("64K", 65536), ("4M", 4 << 20), ("1g", 1 << 30), ("16KB", 16384)])
def test_sizes_read_like_nccl_tests(text, size):
    assert bench.parse_size(text) == size


def test_sweep():
    assert bench.sweep(8, 64 << 20, 4)[-1] == 32 << 20
    assert bench.sweep(8, 512, 8) == [8, 64, 512]
    with pytest.raises(ValueError):
        bench.parse_size("lots")


def test_point_to_point_latency_is_reported_as_percentiles():
    import allreduce_edu as ae

    with ae.Cluster(2, transport="local") as cluster:
        one_way = cluster.run(bench.latency, 8, 20)[0]
        p2p, _ = bench.run(cluster, ["ring"], [8], iters=2, warmup=1)
    assert len(one_way) == 20 and all(t > 0 for t in one_way)
    assert 0 < p2p["p50_us"] <= p2p["p99_us"]
    line = bench.format_p2p(p2p)
    assert f"(p50 {p2p['p50_us']:.0f} us, p99 {p2p['p99_us']:.0f} us)" in line
    assert p2p["contract_us"] > 0 and (f"the contract alone (send + recv between two thread ranks, no wire) "
                                       f"{p2p['contract_us']:.1f} us") in line


def test_the_contracts_cost_times_real_sends_and_recvs(monkeypatch):
    from allreduce_edu.bench import floor
    from allreduce_edu.comm.base import Communicator

    calls = {"send": 0, "recv": 0}
    for name in calls:
        real = getattr(Communicator, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(Communicator, name, counted)
    assert floor.contract_us(rounds=30, warmup=5) > 0
    assert calls == {"send": 35, "recv": 35}


def test_bench_refuses_windowed_algorithms_on_grpc_before_starting_ranks():
    result = cli("bench", "-n", "2", "--algorithm", "ring,one_shot", "-b", "8", "-e", "8")
    assert result.returncode == 2 and "one_shot run on symmetric windows, which the grpc transport " \
        "has not: use --transport shm" in result.stderr, result.stderr


@pytest.mark.processes
def test_bench_on_shm_prints_the_pipe_floor_a_window_and_the_contract_beside_send_recv():
    result = cli("bench", "--transport", "shm", "-n", "2", "--algorithm", "one_shot,two_shot",
                 "-b", "8", "-e", "64", "--iters", "5", "--warmup", "1")
    assert result.returncode == 0, result.stderr
    floor = re.search(r"a bare os.pipe ping-pong between two processes ([\d.]+) us; send/recv p50 = "
                      r"([\d.]+)x it; a symmetric window's put \+ signal ([\d.]+) us = ([\d.]+)x it; "
                      r"the contract alone \(send \+ recv between two thread ranks, no wire\) ([\d.]+) us = "
                      r"([\d.]+)x it", result.stdout)
    assert floor and float(floor[1]) > 0 and float(floor[5]) > 0, result.stdout
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 1:  # pinned as well
        pinned = re.search(r"the same pipe pinned: ([\d.]+) us on one core \(a hand-over\), ([\d.]+) us "
                           r"across two \(an idle core wakes up\); send/recv p50 = [\d.]+x and [\d.]+x them",
                           result.stdout)
        assert pinned and float(pinned[1]) > 0 and float(pinned[2]) > 0, result.stdout
    assert [line.split()[3] for line in result.stdout.splitlines()
            if line.split()[:1] == ["8"]] == ["one_shot", "two_shot"]
