"""nccl-tests style benchmarks: all-reduce algorithms and peers (allreduce.py), the fused
operator (fused.py), the Numba kernels (kernels.py). `allreduce-edu bench` prints them; lessons
03, 05-07 use them.
"""

from .allreduce import (
    add_predictions,
    combine,
    expected,
    format_p2p,
    format_table,
    latency,
    measure,
    parse_size,
    pattern,
    peer_rows,
    pingpong,
    run,
    sweep,
    write_json,
)
from .command import command
from .links import compare, fit, format_comparison

__all__ = ["command", "compare", "fit", "format_comparison",
           "run", "measure", "pingpong", "latency", "combine", "peer_rows", "add_predictions",
           "parse_size", "sweep", "pattern", "expected", "format_p2p", "format_table", "write_json"]
