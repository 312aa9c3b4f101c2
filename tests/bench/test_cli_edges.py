"""The command line's edges: every bad value is one line and exit 2, oversized worlds are refused at once."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

import allreduce_edu as ae
from allreduce_edu.cli import build_parser, main
from allreduce_edu.runtime import limits

BAD = [
    (["bench", "-n", "0"], "must be >= 1, got 0"),
    (["bench", "-n", "two"], "invalid literal"),
    (["bench", "-b", "10X"], "cannot read size '10X'"),
    (["bench", "-b", "1M", "-e", "8"], "-b 1048576 is larger than -e 8"),
    (["launch", "-n", "2", "no_such_script.py"], "no script 'no_such_script.py' here"),
    (["bench", "-f", "1"], "must be >= 2"),
    (["bench", "--algorithm", "foo"], "unknown algorithm(s) foo"),
    (["bench", "--iters", "0"], "must be >= 1"),
    (["bench", "--op", "layernorm", "--rows", "a"], "rows: invalid literal"),
    (["bench", "--op", "layernorm", "--dtype", "int32"], "needs --dtype float32 or float64"),
    (["bench", "--topology", "3y"], "cannot read topology '3y'"),
    (["bench", "--topology", "2x2", "--peer", "gloo"], "cannot cross the emulated --topology"),
    (["bench", "--topology", "2x2", "--inter-link", "fast"], "cannot read link 'fast'"),
    (["bench", "--dtype", "complex64"], "invalid choice"),
    (["demo", "--count", "-1"], "must be >= 0"),
    (["demo", "--transport", "pigeon"], "invalid choice"),
    (["launch", "-n", "0", "train.py"], "-n must be an integer >= 1"),
    (["launch", "--nnodes", "2", "train.py"], "several nodes need --rendezvous"),
    (["lessons", "--reset", "77", "--no-lab"], "no lesson 77"),
    (["frobnicate"], "invalid choice"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_value_is_one_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit:
        main(argv)
    err = capsys.readouterr().err
    assert exit.value.code == 2
    assert len(err.strip().splitlines()) == 1 and message in err and "error:" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [["bench", "-n", "99999"], ["demo", "-n", "99999"],
                                  ["launch", "-n", "99999", "train.py"]])
def test_worlds_beyond_the_machine_are_refused_at_once_naming_the_limit_and_the_override(argv, capsys):
    before = set(multiprocessing.active_children())
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert time.monotonic() - t0 < 1 and set(multiprocessing.active_children()) == before
    err = capsys.readouterr().err
    most, _ = limits.limit()
    assert exit.value.code == 2 and f"at most {most}" in err and "--max-ranks 99999" in err


def test_cluster_refuses_an_oversized_world_before_starting_a_process(monkeypatch):
    before = set(multiprocessing.active_children())
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"world_size=99999 is more ranks than this machine can hold.*"
                                         r"max_ranks=99999.*ALLREDUCE_EDU_MAX_RANKS=99999"):
        ae.Cluster(99999)
    with pytest.raises(ValueError, match="more ranks than this machine"):
        ae.Cluster(100_000, transport="local")
    assert time.monotonic() - t0 < 1 and set(multiprocessing.active_children()) == before


def test_the_limit_follows_free_memory_and_cores_and_can_be_overridden(monkeypatch):
    monkeypatch.setattr(limits, "available_bytes", lambda: 3 * limits.RANK_MIB << 20)
    assert limits.limit()[0] == 3 and "GiB of memory available" in limits.limit()[1]
    with pytest.raises(ValueError, match="at most 3"):
        limits.check_world_size(4)
    assert limits.check_world_size(4, max_ranks=4) == 4  # those who know may override
    monkeypatch.setenv(limits.ENV, "8")
    assert limits.check_world_size(8) == 8
    with pytest.raises(ValueError, match="over max_ranks=8"):
        limits.check_world_size(9)
    monkeypatch.setenv(limits.ENV, "many")
    with pytest.raises(ValueError, match="not a number of ranks"):
        limits.check_world_size(2)


def test_help_lists_every_subcommand_and_each_subcommand_its_options(capsys):
    parser = build_parser()
    top = parser.format_help()
    for command in ("lessons", "demo", "bench", "launch"):
        assert command in top
        sub = parser.commands[command].format_help()
        for action in parser.commands[command]._actions:
            assert all(option in sub for option in action.option_strings)
            assert action.help or action.dest == "help", f"{command} {action.dest} has no help"


def test_max_ranks_reaches_the_cluster_the_command_starts(monkeypatch, capsys):
    monkeypatch.setattr(limits, "limit", lambda processes=True: (2, "a test's tiny machine"))
    monkeypatch.setenv(limits.ENV, "")  # main sets it for the ranks it starts; undone after the test
    with pytest.raises(SystemExit):
        main(["demo", "-n", "3", "--transport", "local", "--count", "10"])
    assert "at most 2 (a test's tiny machine)" in capsys.readouterr().err
    assert main(["demo", "-n", "3", "--transport", "local", "--count", "10", "--max-ranks", "3"]) == 0
    assert os.environ[limits.ENV] == "3" and "ring" in capsys.readouterr().out


def test_an_error_while_running_is_not_a_usage_error(monkeypatch):
    import allreduce_edu.cli as cli

    def broken(*args, **kwargs):
        raise ValueError("rank 1: a message over the limit")
    monkeypatch.setattr(cli, "demo", broken)
    with pytest.raises(ValueError, match="rank 1"):  # the traceback names the rank, not --help
        main(["demo", "-n", "2", "--transport", "local"])


def test_ctrl_c_during_a_command_is_one_line_and_exit_130(monkeypatch, capsys):
    import allreduce_edu.cli as cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "demo", interrupted)
    assert main(["demo", "-n", "2", "--transport", "local"]) == 130
    assert capsys.readouterr().err.strip() == ("allreduce-edu demo: interrupted; every rank it started "
                                               "was stopped")
