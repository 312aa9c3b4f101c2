"""MPI as a transport: the package's algorithms over mpi4py's Isend/Irecv (extra `[mpi]`).
Lesson 09.

    # mpirun -n 4 python script.py
    comm = MPICommunicator()                      # MPI.COMM_WORLD
    y = allreduce_edu.allreduce(comm, x, algorithm="ring")
    assert np.allclose(y, comm.builtin_allreduce(x))   # MPI's own Allreduce is the oracle
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import time

import numpy as np

from ....ops import MPI_OPS, check_op
from .communicator import EngineCommunicator

# Test() calls before a waiting rank starts sleeping between polls (each call drives MPI's progress)
SPIN_POLLS = 2000


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise RuntimeError(f"mpi4py is not installed ({e}); "
                           f"pip install 'allreduce-edu[mpi]' and an MPI library "
                           f"(e.g. apt-get install openmpi-bin libopenmpi-dev)") from None
    return MPI


class MPICommunicator(EngineCommunicator):
    """A rank of an MPI communicator (default MPI.COMM_WORLD)
    that runs our algorithms over point-to-point."""

    engine = "mpi"

    def __init__(self, mpi_comm=None, timeout: float = 30.0):
        self.MPI = _mpi()
        self.mpi = mpi_comm if mpi_comm is not None else self.MPI.COMM_WORLD
        super().__init__(self.mpi.Get_rank(), self.mpi.Get_size(), timeout)
        # the standard promises at least 32768
        self.tag_limit = int(self.mpi.Get_attr(self.MPI.TAG_UB)) + 1

    def _isend(self, dst: int, tag: int, buffer: np.ndarray):
        datatype = self.MPI.BYTE if buffer.dtype == np.uint8 else self.MPI.INT64_T
        return self.mpi.Isend([buffer, datatype], dst, tag)

    def _irecv(self, src: int, tag: int, buffer: np.ndarray):
        datatype = self.MPI.BYTE if buffer.dtype == np.uint8 else self.MPI.INT64_T
        return self.mpi.Irecv([buffer, datatype], src, tag)

    def _wait(self, request, deadline: float) -> bool:
        polls = 0
        while not request.Test():
            if time.monotonic() > deadline:
                return False  # the request stays posted: after a timeout this communicator is done
            polls += 1
            if polls > SPIN_POLLS:
                time.sleep(1e-4)  # many ranks on few cores: let the others run
        return True

    def builtin_allreduce(self, x: np.ndarray, op: str = "sum") -> np.ndarray:
        """MPI's own Allreduce of `x` (a new array)."""
        x = np.ascontiguousarray(x)
        out = np.empty_like(x)
        self.mpi.Allreduce(x.reshape(-1), out.reshape(-1),
                           op=getattr(self.MPI, MPI_OPS[check_op(op)]))
        return out


def mpirun_command(world_size: int) -> list[str]:
    """`mpirun -n N` for processes on this machine (as root too);
    RuntimeError without Open MPI or mpi4py."""
    # not imported here: that would start MPI in this process
    if importlib.util.find_spec("mpi4py") is None:
        raise RuntimeError("mpi4py is not installed; pip install 'allreduce-edu[mpi]'")
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise RuntimeError("mpirun is not on PATH; install an MPI library "
                           "(e.g. apt-get install openmpi-bin)")
    root = ["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    # ranks share the cores with other processes here: yield while waiting instead of spinning
    return [mpirun, *root, "--oversubscribe", "--bind-to", "none",
            "--mca", "mpi_yield_when_idle", "1", "-n", str(world_size)]
