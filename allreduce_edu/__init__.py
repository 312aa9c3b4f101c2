"""allreduce-edu: collective communication you can read, run on real gRPC ranks,
watch and measure."""

from .collectives import (
    all_gather,
    allreduce,
    broadcast,
    iall_gather,
    iallreduce,
    ireduce_scatter,
    reduce,
    reduce_scatter,
    wait_all,
)
from .collectives.fused import reduce_layernorm_broadcast
from .comm.errors import CollectiveError, CollectiveMismatch, CollectiveTimeout, RankFailure
from .runtime import TESTBED, TESTBED_IN_FLIGHT, Cluster, init, testbed
from .version import __version__  # noqa: F401 - allreduce_edu.__version__

__all__ = ["Cluster", "testbed", "TESTBED", "TESTBED_IN_FLIGHT", "init",
           "allreduce", "reduce", "broadcast", "reduce_scatter", "all_gather",
           "iallreduce", "ireduce_scatter", "iall_gather", "wait_all",
           "reduce_layernorm_broadcast", "CollectiveError", "RankFailure", "CollectiveTimeout",
           "CollectiveMismatch"]
