"""The lessons under nbval: a cell (or a notebook) that needs an optional extra missing here is
skipped with the reason, never run to a different output (allreduce_edu.course.extras); and, where
ALLREDUCE_EDU_LESSON_LIMIT_S is set (.ci/run sets 100 on its 2-core machine), a lesson that takes
longer than that to execute fails the cell that took it over (issue 36: every lesson runs top to
bottom in under two minutes on a 2-core laptop, with a margin). Off by default: a slower or busier
machine than CI's must not fail a lesson with nothing wrong in it."""

from __future__ import annotations

import os

import pytest

#: the seconds one lesson may take under nbval, kernel start included (unset or 0: no limit; only
#: nbval's runs read it: the busy-laptop test runs the keys through nbclient, with no limit)
LIMIT_VARIABLE = "ALLREDUCE_EDU_LESSON_LIMIT_S"

_spent: dict[str, float] = {}  # notebook -> seconds its cells have taken so far
_over: set[str] = set()  # notebooks already reported over the limit
_lessons_started: list[bool] = []  # [True] once the first lesson's first cell has been set up


def _notebook(item) -> str | None:
    cell, notebook = getattr(item, "cell", None), getattr(item.parent, "nb", None)
    return None if cell is None or notebook is None else str(item.parent.path)


def pytest_collection_modifyitems(config, items):
    from allreduce_edu.course.extras import skip_reason

    for item in items:
        path = _notebook(item)
        if path is None:  # not a notebook cell
            continue
        reason = skip_reason(item.parent.nb.metadata, item.cell.metadata)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before the first lesson, close the clusters the tests share (tests/conftest.py keeps one
    per transport, size and backend for the session): some 60 rank processes idle beside a lesson
    otherwise, and their threads, waking now and then, take the lesson's ranks' turns on the cores
    (lesson 12's overlap measurement moved with them, and its time neared the limit)."""
    if _notebook(item) is None or _lessons_started:
        return
    _lessons_started.append(True)
    for plugin in item.config.pluginmanager.get_plugins():
        close = getattr(plugin, "close_clusters", None)
        if callable(close):
            close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    path = _notebook(item)
    if path is None:
        return
    report = outcome.get_result()
    _spent[path] = _spent.get(path, 0.0) + report.duration
    limit = float(os.environ.get(LIMIT_VARIABLE) or 0)
    if limit and report.when == "call" and report.passed and _spent[path] > limit \
            and path not in _over:  # the cell during which the lesson went over fails, once
        _over.add(path)
        report.outcome = "failed"
        report.longrepr = (f"{os.path.basename(path)} took {_spent[path]:.0f} s to execute, over "
                           f"the {limit:.0f} s a lesson may take here (the README promises each "
                           f"runs in under two minutes on a 2-core laptop)")
