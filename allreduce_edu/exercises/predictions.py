"""Predictions that count: write your guess down before a cell measures, then see it beside the
measurement and the model.

    record_prediction("03.a", 3.5)          # before: how many times faster will the ring be?
    compare_prediction("03.a", measured=3.6, model=4.0, unit="×")
    # you predicted 3.5×, measured 3.6×, the model says 4×

Guesses live in your progress file (progress.py); `progress()` lists them beside the exercises.
"""

from __future__ import annotations

import math
import numbers

from .feedback import wrap
from .progress import predictions
from .progress import record_prediction as _store


def record_prediction(key: str, value) -> None:
    """Write down your guess for prediction `key` ("03.a"), before the cell that measures it."""
    if value is None or (isinstance(value, str) and value.strip() in ("", "?")):
        print(f'Nothing recorded for {key}: replace None with your guess, then run this cell.')
        return
    if not isinstance(value, (int, float, str)) or isinstance(value, bool):
        raise TypeError(f"a prediction is a number or a short text, not {type(value).__name__}")
    _store(str(key), value=value)
    print(f"Recorded your prediction for {key}: {show(value)}. A later cell measures it.")


def recorded(key: str):
    """Your recorded guess for `key`, or None."""
    return predictions().get(str(key), {}).get("value")


def compare_prediction(key: str, measured, model=None, unit: str = "",
                       said: str = "measured") -> str:
    """Print (and return) "you predicted X, measured Y, the model says Z" for prediction `key`;
    the measurement is stored beside your guess. `said` names where Y comes from when no run
    here measured it ("NCCL reports")."""
    fields = {"measured": measured, "said": said} | ({} if model is None else {"model": model})
    guess = recorded(key)
    if guess is None:
        head = f"{key}: no prediction recorded (predict(\"{key}\", ...) stores one)"
    else:
        _store(str(key), unit=unit, **fields)
        head = f"{key}: you predicted {show(guess, unit)}"
    text = f"{head}, {said} {show(measured, unit)}" + (
        "" if model is None else f", the model says {show(model, unit)}") + "."
    print(wrap(text))
    return text


def show(value, unit: str = "") -> str:
    """3.5 -> "3.5", 4.0 -> "4", 1512000 -> "1512000" (a whole number exactly), a text as it
    is; the unit after it."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = int(value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        value = f"{value:.3g}"
    return f"{value}{unit}"


def predict(key: str, value) -> None:
    """record_prediction, by the short name the lessons' prediction cells use."""
    record_prediction(key, value)


def compare(key: str, measured, model=None, unit: str = "", said: str = "measured") -> None:
    """compare_prediction, printed only (a lesson's measuring cell shows the line once)."""
    compare_prediction(key, measured, model, unit, said)
