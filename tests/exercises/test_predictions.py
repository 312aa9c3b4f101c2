"""Predictions that count: a guess is recorded, compared with the measurement, listed in progress()."""

from __future__ import annotations

import json

from allreduce_edu.exercises import compare_prediction, progress, record_prediction


def test_a_prediction_is_recorded_and_compared(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ALLREDUCE_EDU_DATA_DIR", str(tmp_path))
    progress(reset=True)
    record_prediction("03.a", 3.5)
    assert "Recorded your prediction for 03.a: 3.5" in capsys.readouterr().out
    data = json.loads((tmp_path / "progress.json").read_text())
    assert data["predictions"]["03.a"]["value"] == 3.5
    text = compare_prediction("03.a", measured=3.6, model=4.0, unit="×")
    assert text == "03.a: you predicted 3.5×, measured 3.6×, the model says 4×."
    assert text in capsys.readouterr().out
    table = repr(progress())
    assert "03.a" in table and "3.5×, measured 3.6×, the model said 4×" in table
    assert "1 prediction recorded" in table.splitlines()[-1]
    # beside lesson 03's exercises: after 03.4, before 04.1
    ids = [line.split()[0] for line in table.splitlines()[1:-1]]
    assert ids.index("03.4") < ids.index("03.a") < ids.index("04.1")


def test_no_prediction_recorded_is_said_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ALLREDUCE_EDU_DATA_DIR", str(tmp_path))
    progress(reset=True)
    text = compare_prediction("05.b", measured=12.0, model=10.0, unit=" ms")
    assert text.startswith("05.b: no prediction recorded") and "measured 12 ms" in text
    assert "the model says 10 ms" in text
    record_prediction("05.b", None)  # the scaffold's None is not a guess
    assert "Nothing recorded" in capsys.readouterr().out
    assert not (tmp_path / "progress.json").exists()


def test_a_later_guess_replaces_the_earlier_and_exercises_are_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("ALLREDUCE_EDU_DATA_DIR", str(tmp_path))
    from allreduce_edu.exercises.lesson03 import check_busbw_answer

    progress(reset=True)
    record_prediction("03.a", 2)
    assert not check_busbw_answer("a")
    record_prediction("03.a", "ring")
    data = json.loads((tmp_path / "progress.json").read_text())
    assert data["predictions"]["03.a"]["value"] == "ring" and data["03.4"]["attempts"] == 1
    assert "0 of" in repr(progress()).splitlines()[-1]


def test_the_lessons_short_names_record_and_print_once(tmp_path, monkeypatch, capsys):
    from allreduce_edu.exercises.predictions import compare, predict

    monkeypatch.setenv("ALLREDUCE_EDU_DATA_DIR", str(tmp_path))
    predict("08.a", 10)
    assert compare("08.a", 6.3, model=15.9, unit="×") is None
    assert capsys.readouterr().out.splitlines()[-1] == "08.a: you predicted 10×, measured 6.3×, the model says 15.9×."


def test_a_claim_prints_a_tick_or_says_the_numbers_do_not_support_it(capsys):
    from allreduce_edu.notebook import claim

    claim(2 < 3, "the ring beats naive")
    assert capsys.readouterr().out == "✓ the ring beats naive\n"
    claim(3 < 2, "the ring beats naive")
    assert capsys.readouterr().out.startswith("✗ not shown this time: the ring beats naive.")


def test_whole_numbers_print_exactly_and_fractions_in_three_digits():
    import numpy as np

    from allreduce_edu.exercises.predictions import show
    assert show(1512000, " B") == "1512000 B" and show(np.int64(7)) == "7"
    assert show(1512000.0, " B") == "1.51e+06 B" and show(3.14159) == "3.14" and show(True) == "True"


def test_a_number_no_run_here_measured_says_where_it_comes_from(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ALLREDUCE_EDU_DATA_DIR", str(tmp_path))
    progress(reset=True)
    record_prediction("18.a", 64e3)
    text = compare_prediction("18.a", 256e3, model=267e3, unit=" B", said="NCCL reports")
    assert text == "18.a: you predicted 6.4e+04 B, NCCL reports 2.56e+05 B, the model says 2.67e+05 B."
    assert "NCCL reports 2.56e+05 B, the model said 2.67e+05 B" in repr(progress())


def test_a_later_measurement_is_called_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("ALLREDUCE_EDU_DATA_DIR", str(tmp_path))
    progress(reset=True)
    record_prediction("18.a", 64e3)
    compare_prediction("18.a", 256e3, unit=" B", said="NCCL reports")
    compare_prediction("18.a", 300e3, unit=" B")
    assert "measured 3e+05 B" in repr(progress()) and "NCCL reports" not in repr(progress())
