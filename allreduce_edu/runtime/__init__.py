"""Where ranks live and how they start:
the Cluster of a notebook, SPMD launch across machines, engines.

    Cluster(4)                     # 4 rank processes (or threads: transport="local") for a notebook
    allreduce-edu launch -n 4 s.py # SPMD: every rank runs s.py, which calls init()
    run_on_engine(fn, "gloo", 3)   # fn(comm) on MPI or torch.distributed processes

Every rank process the package starts runs `worker.main`;
GRACE is how long any of them gets to stop.
"""

from .cluster import Cluster
from .engines import (
    compare_with_builtin,
    engine_available,
    format_comparison,
    missing,
    run_on_engine,
)
from .failures import RemoteTraceback, print_outputs, root_cause
from .rendezvous import init
from .shipping import ship
from .testbed import TESTBED, TESTBED_IN_FLIGHT, testbed
from .worker import GRACE

__all__ = ["Cluster", "RemoteTraceback", "print_outputs", "root_cause", "init", "run_on_engine",
           "engine_available", "missing", "compare_with_builtin", "format_comparison", "ship",
           "GRACE", "testbed", "TESTBED", "TESTBED_IN_FLIGHT"]
