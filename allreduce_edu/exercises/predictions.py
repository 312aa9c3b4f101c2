"""Your predictions, recorded before a measurement and compared with it after.

    predict("03.a", 3.5)                  # before the measuring cell: your guess, recorded
    compare("03.a", 3.6, model=4.0)       # in it: "you predicted 3.5, measured 3.6, the model 4"

Kept beside your progress (`predictions.json` in the same folder); `progress()` lists them.
"""

from __future__ import annotations

import json
import time

from .progress import data_dir


def _file():
    return data_dir() / "predictions.json"


def load() -> dict[str, dict]:
    """{key: {"value": your guess, "when": unix time}}."""
    try:
        data = json.loads(_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def predict(key: str, value) -> None:
    """Record your guess for `key` before the cell that measures it (None: not guessed yet)."""
    if value is None:
        print("○ no prediction yet: replace None with your guess, then run this cell again "
              "(the measuring cell below compares it with what happens).")
        return
    value = float(value)
    data = load()
    data[key] = {"value": value, "when": round(time.time())}
    path = _file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True))
    print(f"recorded: you predict {_show(value)} for {key}. Now run the measurement.")


def compare(key: str, measured: float, model: float | None = None, unit: str = "") -> None:
    """Print one line: your recorded guess for `key` beside the measured value and the model's."""
    guess = load().get(key, {}).get("value")
    parts = [f"you predicted {_show(guess)}{unit}" if guess is not None
             else f"no prediction recorded for {key}",
             f"measured {_show(measured)}{unit}"]
    if model is not None:
        parts.append(f"the model says {_show(model)}{unit}")
    print(", ".join(parts))


def _show(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1e4 else f"{value:,.0f}"
