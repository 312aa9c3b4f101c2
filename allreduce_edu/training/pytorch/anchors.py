"""torch's own compression hooks, the anchors that compress/ is checked against (extra [torch]).

    cluster.run(train_ddp, meet, None, torch_hook=fp16_hook)       # torch's fp16 hook
    cluster.run(train_ddp, meet, None, torch_hook=powersgd_hook)   # its PowerSGD, rank 1
    PowerSGD(1, draw=torch_draw)     # our PowerSGD with torch's random Qs: the same numbers

torch/distributed/algorithms/ddp_comm_hooks: `default_hooks.fp16_compress_hook`,
`powerSGD_hook.powerSGD_hook` with its `PowerSGDState`. Each factory runs on a rank, after its
gloo group is up, and returns DDP's (state, hook) pair.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd


def fp16_hook():
    """torch's fp16_compress_hook on the default (gloo) group."""
    return None, default_hooks.fp16_compress_hook


def powersgd_hook(rank: int = 1, start_powerSGD_iter: int = 2, seed: int = 0):
    """torch's powerSGD_hook, rank `rank`, error feedback and warm start on (its defaults)."""
    state = torch_powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                         start_powerSGD_iter=start_powerSGD_iter,
                                         random_seed=seed)
    return state, torch_powersgd.powerSGD_hook


def torch_draw(seed: int, shapes, dtype) -> list[np.ndarray]:
    """Random Qs as powerSGD_hook draws them: torch.randn after torch.manual_seed(seed)."""
    like = torch.from_numpy(np.empty(0, dtype)).dtype
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return [torch.randn(1, *shape, dtype=like).numpy()[0] for shape in shapes]
