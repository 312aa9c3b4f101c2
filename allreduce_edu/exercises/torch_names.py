"""torch.distributed's names for ours: the table of Exercise 09.2, as the notebook writes it."""

from __future__ import annotations

TORCH_NAMES = {  # ours -> torch.distributed's (the first is the one to write; the others pass too)
    "rank": ("get_rank",),
    "world_size": ("get_world_size",),
    "send": ("send",),
    "recv": ("recv",),
    "isend": ("isend",),
    "sendrecv": ("batch_isend_irecv",),
    "allreduce": ("all_reduce",),
    "reduce_scatter": ("reduce_scatter_tensor", "reduce_scatter"),
    "all_gather": ("all_gather_into_tensor", "all_gather"),
    "broadcast": ("broadcast",),
    "barrier": ("barrier",),
    "init": ("init_process_group",),
    'op="sum"': ("ReduceOp.SUM",),
}


def _quoted(text: str) -> str:
    return f"'{text}'" if '"' in text else f'"{text}"'


def names_cell(value) -> str:
    """Exercise 09.2's dict as the notebook writes it: value(theirs) for each of our names (the key
    writes `dist.` before each: a value that repeated our name would read as the scaffold's key)."""
    return "my_names = {\n" + "".join(f"    {_quoted(ours)}: {_quoted(value(theirs))},\n"
                                      for ours, theirs in TORCH_NAMES.items()) + "}"


def torch_name(text) -> str:
    """'torch.distributed.all_reduce()' -> 'all_reduce'."""
    text = str(text).strip().removesuffix("()")
    for prefix in ("torch.distributed.", "dist."):
        text = text.removeprefix(prefix)
    return text
