"""PyTorch on the package's collectives (extra `[torch]`). Introduced in lessons/13_pytorch.

    hook.register(ddp_model, comm, "ring")        # DDP's gradient buckets all-reduced by our ring
    hook.register(ddp_model, comm, compress=PowerSGD(1))   # or averaged by a compress/ scheme
    ddp.train_ddp(comm, meet, algorithm="ring")   # a rank's side: gloo for DDP's set-up, our hook
    tensor_parallel.sequence_parallel_norm(comm, partial, residual, weight, bias)
                                                  # fused reduce-scatter + LayerNorm + all-gather,
                                                  # as an autograd function
    models.make_bars(), models.make_cnn()         # a generated data set and a small CNN

Importing this package needs no torch; each module above does (`pip install -e ".[torch]"`).
"""

from __future__ import annotations

import importlib.util

NEEDS_TORCH = 'needs PyTorch: pip install -e ".[torch]" (the CPU build is enough)'


def have_torch() -> bool:
    """True when PyTorch is installed, so lesson 13's torch cells can run."""
    return importlib.util.find_spec("torch") is not None
