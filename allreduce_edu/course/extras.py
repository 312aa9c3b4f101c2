"""The optional extras, in one table: what each needs, how to get it, and why it is missing here.

    why_missing("torch")   # "" when PyTorch is installed, else 'needs torch: pip install ...'

Lessons mark a cell (or a whole notebook) that needs an extra with metadata
`{"allreduce_edu": {"requires": ["torch"]}}`; under nbval such a cell is skipped with this reason
where the extra is missing (the repository's conftest.py), and in JupyterLab the cell says so.
A leaf: imports nothing of the package at import time.
"""

from __future__ import annotations

import importlib.util
import shutil

#: extra -> (the module it brings, how to install it)
EXTRAS = {
    "torch": ("torch", 'pip install -e ".[torch]" (the CPU build is enough)'),
    "mpi": ("mpi4py", 'pip install -e ".[mpi]" and an MPI library '
                      "(apt-get install openmpi-bin libopenmpi-dev)"),
    "gpu": ("numba.cuda", 'a CUDA GPU and pip install -e ".[gpu]" (the simulator cannot be timed)'),
    # not an extra: installs with the package, except on macOS, where numba-cuda has no build
    "cuda": ("numba.cuda", "numba-cuda, which installs with allreduce-edu on Linux and Windows "
                           "(macOS has no build)"),
}


def why_missing(extra: str) -> str:
    """Why `extra` cannot run here, with the fix ("" when it can)."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; valid: {', '.join(EXTRAS)}")
    module, how = EXTRAS[extra]
    needs = f"needs {extra}: {how}"
    if extra in ("gpu", "cuda"):
        try:
            from ..kernels.gpu.target import simulated  # picks the target once; cheap without a GPU
        except ImportError:  # no numba-cuda build here (macOS)
            return needs
        return needs if extra == "gpu" and simulated() else ""
    if importlib.util.find_spec(module) is None:
        return needs
    if extra == "mpi" and not shutil.which("mpirun"):
        return "needs mpi: mpirun is not on PATH (apt-get install openmpi-bin libopenmpi-dev)"
    return ""


def requirements(metadata: dict) -> list[str]:
    """The extras a notebook's or a cell's metadata says it needs."""
    return list((metadata or {}).get("allreduce_edu", {}).get("requires", []))


def skip_reason(*metadatas: dict) -> str:
    """Why a cell with these metadata (the notebook's, the cell's) cannot run here ("": it can)."""
    reasons = [why_missing(extra) for m in metadatas for extra in requirements(m)]
    return "; ".join(dict.fromkeys(r for r in reasons if r))
