"""Nothing a CLI test does to this process's environment outlives it, whatever order tests run in."""

import os

import pytest
import test_cli_edges

from allreduce_edu.runtime import limits


def test_the_max_ranks_test_undoes_the_rank_limit_main_sets(capsys):
    """main() sets ALLREDUCE_EDU_MAX_RANKS for the ranks it starts; the test that drives it must undo
    that (a limit left behind once broke every later test)."""
    before = os.environ.get(limits.ENV)
    with pytest.MonkeyPatch.context() as monkeypatch:
        test_cli_edges.test_max_ranks_reaches_the_cluster_the_command_starts(monkeypatch, capsys)
    assert os.environ.get(limits.ENV) == before
