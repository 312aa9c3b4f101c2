"""bench.format_comparison: measured beside the model, and the fitted columns only with a fit."""

from allreduce_edu.bench import format_comparison


def test_the_fitted_columns_appear_only_when_a_row_has_a_fit():
    row = {"algorithm": "ring", "world_size": 8, "bytes": 8, "time_us": 150e3, "model_us": 140e3}
    plain = format_comparison([row]).splitlines()
    assert "÷ model" in plain[0] and "fitted" not in plain[0] and plain[1].endswith("1.07")
    fitted = format_comparison([row | {"fit_us": 160e3}]).splitlines()
    assert fitted[0].endswith("÷ fitted") and fitted[1].endswith("0.94")
