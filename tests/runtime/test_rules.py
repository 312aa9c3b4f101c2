"""Every bad value is refused before work starts, in one line naming the argument and the rule
(runtime/rules.py): the command line exits 2, the API raises ValueError; no rank is started."""

from __future__ import annotations

import multiprocessing
import os

import pytest

import allreduce_edu as ae
from allreduce_edu import cli
from allreduce_edu.runtime import launch
from allreduce_edu.runtime.rules import RULES, check, in_the_clear

COMMAND_LINE = [  # (arguments, words the one line says)
    (["bench", "--links", "10ms"], "--links must be ALPHA,BANDWIDTH"),
    (["bench", "-b", "3G", "-e", "3G"], "more than one rank accepts"),
    (["bench", "-b", "1G", "-e", "1G", "-n", "64", "--max-ranks", "64"], "GiB of memory available"),
    (["bench", "--links", "1e999ms,1GB/s"], "latency must be finite"),
    (["bench", "--links", "1ms,1e-300B/s"], "bandwidth must be at least"),
    (["bench", "--json", "/nonexistent/dir/x.json"], "no folder '/nonexistent/dir'"),
    (["launch", "--timeout", "-1", "x.py"], "--timeout must be finite, > 0"),
    (["launch", "--timeout", "nan", "x.py"], "--timeout must be finite, > 0"),
    (["launch", "--rendezvous-timeout", "inf", "x.py"], "--rendezvous-timeout must be finite"),
    (["launch", "--rendezvous", "127.0.0.1:99999", "x.py"], "port number from 0 to 65535"),
    (["launch", "--host", "0.0.0.0.0", "x.py"], "--host must be an IP address or a host name"),
]


@pytest.mark.parametrize("argv, words", COMMAND_LINE, ids=[" ".join(a) for a, _ in COMMAND_LINE])
def test_a_bad_value_on_the_command_line_is_one_line_and_exit_2(argv, words, capsys):
    before = set(multiprocessing.active_children())  # other tests' clusters may be alive
    with pytest.raises(SystemExit) as stopped:
        cli.main(argv)
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert set(multiprocessing.active_children()) <= before  # nothing was started


def test_lessons_into_a_file_or_a_folder_it_cannot_write_is_refused(tmp_path, capsys):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    with pytest.raises(SystemExit) as stopped:
        cli.main(["lessons", str(a_file), "--no-lab"])
    assert stopped.value.code == 2 and "is a file, not a folder" in capsys.readouterr().err
    if os.name == "posix" and os.geteuid() == 0:
        pytest.skip("root writes into read-only folders: the read-only case needs another user")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["lessons", str(locked / "lessons"), "--no-lab"])
    assert stopped.value.code == 2 and "not a writable folder" in capsys.readouterr().err


@pytest.mark.parametrize("kwargs, words", [
    ({"timeout": float("inf")}, "timeout must be finite, > 0"),
    ({"timeout": -1}, "timeout must be finite, > 0"),
    ({"host": "0.0.0.0.0"}, "host must be an IP address or a host name"),
    ({"links": "10ms"}, "links must be ALPHA,BANDWIDTH"),
    ({"links": 10}, "links must be a Links"),
])
def test_a_bad_value_to_the_api_is_refused_before_a_rank_starts(kwargs, words):
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match=words):
        ae.Cluster(2, "grpc", **kwargs)
    assert set(multiprocessing.active_children()) <= before


def test_launch_from_python_checks_its_times_too():
    with pytest.raises(ValueError, match="--timeout must be finite"):
        launch.launch(["x.py"], 1, timeout=float("nan"))


def test_good_values_pass_converted():
    assert check("timeout", "2.5") == 2.5 and check("--rendezvous", "[::1]:29500") == ("::1", 29500)
    assert check("host", "node-1.example") == "node-1.example"
    assert str(check("links", "1ms,100MB/s")).startswith("every link 1000 us")
    assert set(RULES) >= {"timeout", "host", "links", "--links", "--json", "--rendezvous"}


@pytest.mark.parametrize("host, tls, exposed", [("127.0.0.1", None, False), ("localhost", None, False),
                                                ("[::1]", None, False), ("::1", None, False),
                                                ("0.0.0.0", None, True), ("10.1.2.3", None, True),
                                                ("node7.cluster", None, True), ("10.1.2.3", "a TLS", False)])
def test_listening_beyond_loopback_without_tls_is_named(host, tls, exposed):
    assert bool(in_the_clear(host, tls)) == exposed
    if exposed:
        assert "without TLS" in in_the_clear(host, tls) and host in in_the_clear(host, tls)


@pytest.mark.processes
def test_a_cluster_beyond_loopback_without_tls_warns():
    with pytest.warns(UserWarning, match="0.0.0.0 without TLS"):
        cluster = ae.Cluster(1, host="0.0.0.0")
    cluster.close()


@pytest.mark.parametrize("value", ["fe80::1:2", "::1:29500", "::1"])
def test_an_ipv6_rendezvous_without_brackets_is_refused_not_misread(value):
    with pytest.raises(ValueError, match=r"in brackets, \[ADDRESS\]:PORT"):
        check("--rendezvous", value)  # "fe80::1:2" would have been host fe80::1, port 2
