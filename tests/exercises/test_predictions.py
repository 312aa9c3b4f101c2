"""Predictions are recorded before a measurement and compared after it; claims check a sentence."""

from __future__ import annotations

from allreduce_edu.exercises.predictions import compare, load, predict
from allreduce_edu.notebook import claim


def test_a_prediction_is_recorded_and_compared(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ALLREDUCE_EDU_DATA_DIR", str(tmp_path))
    predict("03.a", None)
    assert "no prediction yet" in capsys.readouterr().out and load() == {}
    compare("03.a", 3.6, model=4)
    assert capsys.readouterr().out == "no prediction recorded for 03.a, measured 3.6, the model says 4\n"
    predict("03.a", 3.5)
    assert load()["03.a"]["value"] == 3.5
    capsys.readouterr()
    compare("03.a", 3.61, model=4.0, unit="×")
    assert capsys.readouterr().out == "you predicted 3.5×, measured 3.61×, the model says 4×\n"


def test_a_claim_prints_a_tick_or_says_the_numbers_do_not_support_it(capsys):
    claim(2 < 3, "the ring beats naive")
    assert capsys.readouterr().out == "✓ the ring beats naive\n"
    claim(3 < 2, "the ring beats naive")
    assert capsys.readouterr().out.startswith("✗ not shown this time: the ring beats naive.")
