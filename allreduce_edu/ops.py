"""The one table of reduction ops, and of norms:
every other table in the package derives from these.

Names as in NCCL and MPI (`ncclSum`, `MPI_SUM`): gloo's `ReductionFunction` table is the model.
"""

from __future__ import annotations

import numpy as np

#         op      NumPy ufunc    MPI      torch.distributed.ReduceOp
_TABLE = (("sum",  np.add,       "SUM",   "SUM"),
          ("prod", np.multiply,  "PROD",  "PRODUCT"),
          ("max",  np.maximum,   "MAX",   "MAX"),
          ("min",  np.minimum,   "MIN",   "MIN"))

OPS: dict[str, np.ufunc] = {name: ufunc for name, ufunc, _, _ in _TABLE}  # op -> elementwise ufunc
MPI_OPS: dict[str, str] = {name: mpi for name, _, mpi, _ in _TABLE}  # op -> attribute of mpi4py.MPI
TORCH_OPS: dict[str, str] = {name: torch for name, _, _, torch in _TABLE}  # op -> torch ReduceOp
# what the fused Reduce + norm + Broadcast operator can normalise with
NORMS = ("layernorm", "rmsnorm")


def check_op(op: str, rank: int | None = None) -> str:
    """`op` if it is one of OPS; else ValueError listing them (naming the rank when given)."""
    if op not in OPS:
        where = f"rank {rank}: " if rank is not None else ""
        raise ValueError(f"{where}unknown op {op!r}; valid ops are {', '.join(OPS)}")
    return op


def check_norm(norm: str, where: str = "") -> str:
    """`norm` if it is one of NORMS; else ValueError listing them (after `where`, when given)."""
    if norm not in NORMS:
        raise ValueError(f"{where + ': ' if where else ''}unknown norm {norm!r}; "
                         f"valid norms are {', '.join(NORMS)}")
    return norm
