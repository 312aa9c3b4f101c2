"""The root conftest.py's hooks for the lessons under nbval: before the first lesson runs, the
tests' shared clusters are closed, so no idle rank process of the tests runs beside a lesson."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]


def _root_conftest():
    spec = importlib.util.spec_from_file_location("root_conftest_under_test", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # a fresh copy: its own "lessons started" state
    return module


def _item(plugins, notebook: bool):
    parent = SimpleNamespace(nb=SimpleNamespace(metadata={}) if notebook else None,
                             path=ROOT / "lessons" / "00_welcome.ipynb")
    return SimpleNamespace(cell={} if notebook else None, parent=parent,
                           config=SimpleNamespace(pluginmanager=SimpleNamespace(get_plugins=lambda: plugins)))


def test_the_first_lesson_cell_closes_the_tests_shared_clusters_once():
    hooks, closed = _root_conftest(), []
    plugins = [SimpleNamespace(close_clusters=lambda: closed.append(1)), SimpleNamespace()]
    hooks.pytest_runtest_setup(_item(plugins, notebook=False))  # a test, not a lesson's cell
    assert closed == []
    hooks.pytest_runtest_setup(_item(plugins, notebook=True))
    hooks.pytest_runtest_setup(_item(plugins, notebook=True))
    assert closed == [1]
