"""A rank's side of DDP on the package's collectives: gloo for DDP's own set-up, the hook for the
gradients. Introduced in lessons/13_pytorch.

    port = free_port()                                    # chosen by the caller, shipped in
    cluster.run(train_ddp, port, algorithm="ring")        # or algorithm=None: gloo's all_reduce

DDP needs a torch.distributed process group even when a hook does its communication: it
broadcasts the initial parameters and checks that ranks agree on the model. Each rank joins one
over TCP on the given port, and leaves it when training ends, so the same ranks can train again.
"""

from __future__ import annotations

import contextlib
import datetime
import socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .hook import register
from .models import flat_parameters, make_bars, make_cnn, train


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (for the gloo rendezvous)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def gloo_group(comm, port: int, timeout: float = 60.0):
    """torch.distributed's default group of the same ranks as `comm` (rank 0 hosts the store)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank,
                            world_size=comm.world_size,
                            timeout=datetime.timedelta(seconds=timeout))
    try:
        yield
    finally:
        dist.destroy_process_group()


def train_ddp(comm, port: int, algorithm="ring", steps: int = 20, batch: int = 64,
              lr: float = 0.1, seed: int = 0, bucket_cap_mb: float = 0.01,
              samples: int = 1024) -> dict:
    """On one rank: train lesson 13's CNN under DDP, its buckets all-reduced by `algorithm` (a
    name, or fn(comm, x)) over `comm`, or by gloo's all_reduce when algorithm is None.
    This rank's losses and seconds per step, the buckets, the final parameters."""
    torch.set_num_threads(1)  # the ranks share this machine's cores
    X, y = make_bars(samples, seed)
    with gloo_group(comm, port):
        # small buckets (10 kB), so even this small model's gradients travel in several
        model = DistributedDataParallel(make_cnn(seed), bucket_cap_mb=bucket_cap_mb)
        state = None if algorithm is None else register(model, comm, algorithm)
        run = train(model, X, y, steps, batch, lr, comm.rank, comm.world_size, seed)
    run["buckets"] = [] if state is None else state.buckets
    run["params"] = flat_parameters(model.module)
    run["bytes_sent"] = sum(e.nbytes for e in comm.trace.events if e.src == comm.rank)
    return run
