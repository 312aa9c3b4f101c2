"""How many ranks this machine can hold, decided before a single process starts. Lesson 00.

A rank process costs memory (about RANK_MIB resident: Python, NumPy, gRPC) and CPU (gRPC's threads
and the algorithm share the cores). Asking for more than the machine holds used to start processes
until the machine froze; now it is refused at once, saying the limit, why, and how to override it:
`Cluster(..., max_ranks=N)`, `--max-ranks N` on the command line, or ALLREDUCE_EDU_MAX_RANKS=N.
"""

from __future__ import annotations

import os

from .osfacts import available_bytes, usable_cpus

ENV = "ALLREDUCE_EDU_MAX_RANKS"
# resident memory of one gRPC rank process (measured ~110-140 MiB after a soak), with margin
RANK_MIB = 150
PROCESSES_PER_CORE = 8  # beyond this, ranks mostly wait for each other's CPU; timeouts follow
THREADS_PER_CORE = 64  # thread ranks (transport="local") share one process: cheap, but not free


def limit(processes: bool = True) -> tuple[int, str]:
    """(the most ranks this machine should run at once, why that many)."""
    cores = usable_cpus()
    if not processes:
        return THREADS_PER_CORE * cores, f"{THREADS_PER_CORE} thread ranks per core × {cores} cores"
    by_cpu = PROCESSES_PER_CORE * cores
    why = f"{PROCESSES_PER_CORE} rank processes per core × {cores} cores"
    free = available_bytes()
    if free is not None and free // (RANK_MIB << 20) < by_cpu:
        return max(1, int(free // (RANK_MIB << 20))), (
            f"{free / 2**30:.1f} GiB of memory available ÷ ~{RANK_MIB} MiB per rank process")
    return by_cpu, why


def check_world_size(world_size, processes: bool = True, max_ranks: int | None = None,
                     what: str = "world_size") -> int:
    """`world_size` if this machine can hold that many ranks;
    ValueError naming the limit and the override."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"{what} must be an integer >= 1, got {world_size!r}")
    if max_ranks is None and os.environ.get(ENV, "").strip():
        try:
            max_ranks = int(os.environ[ENV])
        except ValueError:
            raise ValueError(f"{ENV}={os.environ[ENV]!r} is not a number of ranks") from None
    if max_ranks is not None:
        if world_size > max_ranks:
            raise ValueError(f"{what}={world_size} is over max_ranks={max_ranks}, "
                             f"the limit you set")
        return world_size
    most, why = limit(processes)
    if world_size > most:
        raise ValueError(f"{what}={world_size} is more ranks than this machine can hold at once: "
                         f"at most {most} ({why}). "
                         f"If you know better, raise the limit: max_ranks={world_size} (Cluster), "
                         f"--max-ranks {world_size} (command line) or {ENV}={world_size}.")
    return world_size
