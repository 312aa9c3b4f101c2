"""The lessons under nbval: a cell (or a notebook) that needs an optional extra missing here is
skipped with the reason, never run to a different output (allreduce_edu.course.extras)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    from allreduce_edu.course.extras import skip_reason

    for item in items:
        cell, notebook = getattr(item, "cell", None), getattr(item.parent, "nb", None)
        if cell is None or notebook is None:  # not a notebook cell
            continue
        reason = skip_reason(notebook.metadata, cell.metadata)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
