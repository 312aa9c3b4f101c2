"""A claim is compared by nbval as its sentence, held or not (issue 36): a busy laptop may move a
measurement, and a lesson's check must not turn on that."""

from __future__ import annotations

import re
from pathlib import Path

from nbval.plugin import get_sanitize_patterns

from allreduce_edu.notebook import claim

SANITIZE = Path(__file__).resolve().parents[1] / "lessons" / "nbval_sanitize.cfg"


def _as_nbval_sees(text: str) -> str:
    for regex, replace in get_sanitize_patterns(SANITIZE.read_text()):
        text = re.sub(regex, replace, text)
    return text


def test_a_claim_that_failed_this_time_reads_as_held_to_nbval_and_nothing_else_does(capsys):
    sentence = "at 64 KiB the ring beats naive by 1.5×, at N = 4"
    claim(True, sentence)
    held = capsys.readouterr().out
    claim(False, sentence)
    failed = capsys.readouterr().out
    assert failed.startswith("✗ not shown this time") and held.startswith("✓")
    assert _as_nbval_sees(failed) == _as_nbval_sees(held)
    claim(True, "another sentence")
    assert _as_nbval_sees(capsys.readouterr().out) != _as_nbval_sees(held)  # the words still count
    assert _as_nbval_sees("✗ wrong at rank 2\n") == "✗ wrong at rank 2\n"  # a checker's ✗ is untouched


def test_in_strict_mode_a_claim_that_does_not_hold_fails_its_cell(monkeypatch, capsys):
    import pytest

    from allreduce_edu.notebook import STRICT_CLAIMS, ClaimNotShown

    monkeypatch.setenv(STRICT_CLAIMS, "1")
    claim(True, "held")  # a claim that holds still prints
    assert capsys.readouterr().out == "✓ held\n"
    with pytest.raises(ClaimNotShown, match="did not hold: the ring beats naive"):
        claim(False, "the ring beats naive")
