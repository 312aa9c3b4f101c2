"""Shipping a call to ranks: notebook functions by value (their module may not exist on a rank),
packages by name."""

from __future__ import annotations

import sys
import threading

import cloudpickle

# cloudpickle's by-value registry is global: two threads shipping from one module (two clusters
# run from threads) must not unregister it under each other
_LOCK = threading.Lock()


def ship(fn, args, kwargs) -> bytes:
    """Pickle a call for the ranks. Functions from notebooks, scripts, tests and modules beside them
    go by value (a rank may not be able to import them); installed packages go by reference."""
    # e.g. a learner's fn as an argument
    callables = [fn] + [a for a in (*args, *kwargs.values()) if callable(a)]
    modules = {sys.modules.get(getattr(f, "__module__", None) or "") for f in callables}
    local = [m for m in modules
             if m is not None and m.__name__ not in ("__main__", "builtins") and _is_local(m)]
    with _LOCK:
        for module in local:
            cloudpickle.register_pickle_by_value(module)
        try:
            return cloudpickle.dumps((fn, args, kwargs))
        finally:
            for module in local:
                cloudpickle.unregister_pickle_by_value(module)


def _is_local(module) -> bool:
    path = getattr(module, "__file__", None) or ""
    return (bool(path) and "-packages" not in path
            and not module.__name__.startswith("allreduce_edu"))
