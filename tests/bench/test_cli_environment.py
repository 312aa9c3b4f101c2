"""Runs after test_cli_edges.py: nothing a CLI test did to the environment is left behind."""

import os

from allreduce_edu.runtime import limits


def test_no_rank_limit_leaks_out_of_the_cli_tests():
    assert not os.environ.get(limits.ENV)
