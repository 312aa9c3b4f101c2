"""Counting the rows each rank normalises through allreduce_edu.kernels while a function runs."""

from __future__ import annotations

import threading

import numpy as np

from .. import kernels
from ..kernels import cpu

_MODULES = (kernels, cpu)  # the package re-exports cpu's names: a caller may reach either

_NORM_FUNCTIONS = ("layernorm", "rmsnorm", "add_layernorm", "sum_layernorm")
_PATCH_LOCK = threading.Lock()
_PATCH = {"users": 0, "originals": {}}
_COUNT = threading.local()  # .rows: rows this rank (thread) normalised while the learner's runs


def _rows(a) -> int:
    """Rows of an array normalised over its last axis (a 1-D array is one row)."""
    shape = np.shape(a)
    return int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1


def _counting(name, fn):
    def counted(*args, **kwargs):
        first = args[0] if args else next(iter(kwargs.values()), None)
        if hasattr(_COUNT, "rows"):
            _COUNT.rows += _rows(first[0] if name == "sum_layernorm" else first)
        return fn(*args, **kwargs)
    counted.__name__ = counted.__qualname__ = fn.__name__
    counted.__doc__ = fn.__doc__
    return counted


class CountRows:
    """While active on this thread, rows normalised through kernels.* are counted (local ranks
    share the module)."""

    def __enter__(self):
        with _PATCH_LOCK:
            if _PATCH["users"] == 0:
                for name in _NORM_FUNCTIONS:
                    _PATCH["originals"][name] = original = getattr(cpu, name)
                    for module in _MODULES:
                        setattr(module, name, _counting(name, original))
            _PATCH["users"] += 1
        _COUNT.rows = 0
        return self

    def __exit__(self, *exc):
        self.rows = _COUNT.rows
        del _COUNT.rows
        with _PATCH_LOCK:
            _PATCH["users"] -= 1
            if _PATCH["users"] == 0:
                for name, fn in _PATCH["originals"].items():
                    for module in _MODULES:
                        setattr(module, name, fn)
