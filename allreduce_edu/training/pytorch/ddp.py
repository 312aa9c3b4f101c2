"""A rank's side of DDP on the package's collectives: gloo for DDP's own set-up, the hook for the
gradients. Introduced in lessons/13_pytorch.

    meet = rendezvous()                                   # chosen by the caller, shipped in
    cluster.run(train_ddp, meet, algorithm="ring")        # or algorithm=None: gloo's all_reduce

DDP needs a torch.distributed process group even when a hook does its communication: it
broadcasts the initial parameters and checks that ranks agree on the model. The ranks meet through
a file (no TCP store listening anywhere), gloo's own sockets stay on the loopback interface, and
a rank keeps its group for the next run: destroying a gloo group from a thread that holds the GIL
deadlocked once here (its destructor joins a thread that waits for the GIL).
"""

from __future__ import annotations

import atexit
import datetime
import os
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ...collectives.nonblocking import progress_of
from .hook import register
from .models import flat_parameters, make_bars, make_cnn, train


def rendezvous() -> str:
    """Where one run's ranks meet for gloo: a file in a private folder of this machine that nobody
    else knows. Rank 0 removes the folder once every rank has joined (gloo_group); this (the parent)
    process removes what is left when it exits, after a run whose ranks never all joined."""
    folder = tempfile.mkdtemp(prefix="allreduce-edu-gloo-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return f"file://{os.path.join(folder, 'store')}"


def gloo_group(comm, meet: str, timeout: float = 60.0) -> None:
    """torch.distributed's default group of the same ranks as `comm`, joined through `meet` (a
    `rendezvous()`), or the one this rank joined for an earlier run of the same world. Returns once
    every rank has it; rank 0 then removes `meet`'s folder (a kernel that is killed, as nbval stops
    one, runs no exit handler: the folder must not wait for one)."""
    if dist.is_initialized():
        if (dist.get_rank(), dist.get_world_size()) != (comm.rank, comm.world_size):
            raise RuntimeError(f"rank {comm.rank}: this process is already rank {dist.get_rank()} "
                               f"of a gloo group of {dist.get_world_size()}")
    else:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo" if sys.platform == "linux" else "lo0")
        try:
            dist.init_process_group("gloo", init_method=meet, rank=comm.rank,
                                    world_size=comm.world_size,
                                    timeout=datetime.timedelta(seconds=timeout))
        except Exception as e:  # noqa: BLE001 - named, with the rank, on every rank that fails
            raise RuntimeError(f"rank {comm.rank}: could not join the gloo group of "
                               f"{comm.world_size} ranks at {meet}: {type(e).__name__}: {e}") from e
    dist.barrier()  # every rank has joined: nobody reads the meeting file again
    if comm.rank == 0:
        shutil.rmtree(os.path.dirname(meet.removeprefix("file://")), ignore_errors=True)


def train_ddp(comm, meet: str, algorithm="ring", steps: int = 20, batch: int = 64,
              lr: float = 0.1, seed: int = 0, bucket_cap_mb: float = 0.01,
              samples: int = 1024, compress=None, torch_hook=None) -> dict:
    """On one rank: train lesson 13's CNN under DDP, its buckets all-reduced by `algorithm` (a
    name, or fn(comm, x)) over `comm`, or averaged by the compression scheme `compress`, or by
    gloo's all_reduce when algorithm is None: then `torch_hook() -> (state, hook)`, if given, is
    torch's own hook on gloo (fp16_compress_hook, powerSGD_hook: the anchors of compress/).
    This rank's losses and seconds per step, the buckets, the final parameters."""
    torch.set_num_threads(1)  # the ranks share this machine's cores
    X, y = make_bars(samples, seed)
    gloo_group(comm, meet)
    # small buckets (10 kB), so even this small model's gradients travel in several
    model = DistributedDataParallel(make_cnn(seed), bucket_cap_mb=bucket_cap_mb)
    state = None
    if algorithm is not None or compress is not None:
        state = register(model, comm, algorithm or "ring", compress)
    elif torch_hook is not None:
        model.register_comm_hook(*torch_hook())
    try:
        run = train(model, X, y, steps, batch, lr, comm.rank, comm.world_size, seed)
    finally:  # a failed bucket leaves the others' requests queued: finish them before returning
        progress_of(comm).drain(report=False)  # DDP has heard a bucket's error from its future
    run["buckets"] = [] if state is None else state.buckets
    run["params"] = flat_parameters(model.module)
    run["bytes_sent"] = sum(e.nbytes for e in comm.trace.events if e.src == comm.rank)
    return run
