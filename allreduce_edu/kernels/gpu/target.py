"""Which CUDA target runs the kernels: a real GPU when the driver finds one, else the simulator.

Imported before anything else of numba.cuda, so `NUMBA_ENABLE_CUDASIM=1` is set in time.
"""

from __future__ import annotations

import ctypes
import os
import sys

_DRIVERS = ("libcuda.so.1", "libcuda.so", "nvcuda.dll")  # Linux, Linux (dev symlink), Windows


def _gpu_present() -> bool:
    """Whether the CUDA driver loads and counts at least one GPU (asked directly: cheap, no
    numba)."""
    for name in _DRIVERS:
        try:
            driver = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        return driver.cuInit(0) == 0 and driver.cuDeviceGetCount(ctypes.byref(count)) == 0 \
            and count.value > 0
    return False


if "NUMBA_ENABLE_CUDASIM" not in os.environ and not _gpu_present():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    if "numba" in sys.modules:  # numba read its settings when it was imported: read them again
        from numba.core import config as _config

        _config.reload_config()

try:
    # numba.cuda.core is numba-cuda's: without numba-cuda (macOS) Numba's retired target loads
    import numba.cuda.core  # noqa: F401
    from numba import cuda
except ImportError as e:  # numba-cuda (or its CUDA bindings) is not installed: a module missing
    raise ModuleNotFoundError(f"the GPU kernels need numba-cuda, which installs with allreduce-edu "
                              f"on Linux and Windows (macOS has no build; a GPU also needs "
                              f'pip install -e ".[gpu]") ({e})', name="numba.cuda.core") from e



def simulated() -> bool:
    """True when kernels run on the CUDA simulator (Python threads), False on a real GPU."""
    from numba.cuda.core import config

    return bool(config.ENABLE_CUDASIM)


if not simulated() and not cuda.is_available():  # numba.cuda was imported for a GPU before us
    raise ImportError("numba.cuda was imported before allreduce_edu.kernels.gpu on a machine "
                      "without a usable GPU, so the simulator cannot be switched on any more: set "
                      "NUMBA_ENABLE_CUDASIM=1 before starting Python, or import "
                      "allreduce_edu.kernels.gpu first")
