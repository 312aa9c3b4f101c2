"""torch.distributed (gloo, CPU) as a transport: our algorithms over its isend/irecv
(extra `[torch]`). Lesson 09.

    # allreduce-edu launch -n 4 script.py
    # (or torchrun: both set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
    comm = TorchCommunicator()                    # joins (or starts) the default process group
    y = allreduce_edu.allreduce(comm, x, algorithm="ring")
    assert np.allclose(y, comm.builtin_allreduce(x))   # gloo's own all_reduce is the oracle

Named torch_dist, not torch, so that no `import torch` can ever find this module instead of PyTorch.
"""

from __future__ import annotations

import datetime
import importlib.util
import time

import numpy as np

from ....ops import TORCH_OPS, check_op
from ...errors import RankFailure
from .communicator import EngineCommunicator


def require_torch() -> None:
    """RuntimeError, with the fix, when PyTorch is not installed."""
    if importlib.util.find_spec("torch") is None:
        raise RuntimeError("torch is not installed; pip install 'allreduce-edu[torch]' "
                           "(the CPU build is enough)")


class TorchCommunicator(EngineCommunicator):
    """A rank of torch.distributed's default (world) process group,
    running our algorithms over point-to-point."""

    engine = "gloo"

    def __init__(self, timeout: float = 30.0, backend: str = "gloo"):
        require_torch()
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self._owns_group = not dist.is_initialized()
        if self._owns_group:
            # from RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, as torchrun sets them
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
        self.engine = dist.get_backend()
        super().__init__(dist.get_rank(), dist.get_world_size(), timeout)

    def _tensor(self, buffer: np.ndarray):
        return self.torch.from_numpy(buffer)  # shares memory: what arrives lands in `buffer`

    def _isend(self, dst: int, tag: int, buffer: np.ndarray):
        return self.dist.isend(self._tensor(buffer), dst, tag=tag)

    def _irecv(self, src: int, tag: int, buffer: np.ndarray):
        return self.dist.irecv(self._tensor(buffer), src, tag=tag)

    def _wait(self, work, deadline: float) -> bool:
        # gloo completes point-to-point work only inside wait(), never by polling is_completed()
        remaining = max(deadline - time.monotonic(), 0.001)
        try:
            work.wait(timeout=datetime.timedelta(seconds=remaining))
        except RuntimeError as e:
            if "Timed out" in str(e):
                return False
            raise RankFailure(f"rank {self.rank}: torch.distributed failed: {e}") from None
        return True

    def builtin_allreduce(self, x: np.ndarray, op: str = "sum") -> np.ndarray:
        """torch.distributed's own all_reduce of `x` (a new array)."""
        tensor = self.torch.from_numpy(np.array(x, order="C"))  # a copy: all_reduce works in place
        self.dist.all_reduce(tensor, op=getattr(self.dist.ReduceOp, TORCH_OPS[check_op(op)]))
        return tensor.numpy()

    def close(self) -> None:
        super().close()
        if self._owns_group and self.dist.is_initialized():
            self.dist.destroy_process_group()
