"""A lesson as its learner gets it: no stored output answers a prediction before it is made.
Introduced in lessons/00 (`allreduce-edu lessons` copies lessons through it).

The lessons are committed executed, so below `predict("03.a", None)` the cells that measure the
answer show it already. In the learner's copy every code cell after a prediction cell, up to and
including the cell that compares that prediction (`compare("03.a", ...)`), has its outputs cleared;
exercise cells keep their "not attempted yet" feedback. Running the cells brings the outputs back.
"""

from __future__ import annotations

import copy
import re

PREDICT = re.compile(r"""\bpredict\(\s*["']([^"']+)["']\s*,\s*None\s*\)""")
COMPARE = r"""\b(?:compare|compare_prediction)\(\s*["']{key}["']"""


def _source(cell: dict) -> str:
    text = cell.get("source", "")
    return "".join(text) if isinstance(text, list) else text


def answer_spans(nb: dict) -> dict[str, tuple[int, int]]:
    """{prediction key: (index of its predict cell, index of the cell that compares it)}."""
    cells, spans = nb["cells"], {}
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        for key in PREDICT.findall(_source(cell)):
            compare = re.compile(COMPARE.format(key=re.escape(key)))
            end = next((j for j in range(i, len(cells)) if cells[j]["cell_type"] == "code"
                        and compare.search(_source(cells[j]))), None)
            if end is not None:
                spans[key] = (i, end)
    return spans


def hide_answers(nb: dict, exercise_key: str = "exercise") -> dict:
    """A copy of `nb` with the outputs that answer its predictions cleared (see the module)."""
    nb = copy.deepcopy(nb)
    for start, end in answer_spans(nb).values():
        for cell in nb["cells"][start + 1:end + 1]:
            if cell["cell_type"] == "code" and exercise_key not in cell.get("metadata", {}):
                cell["outputs"], cell["execution_count"] = [], None
    return nb
