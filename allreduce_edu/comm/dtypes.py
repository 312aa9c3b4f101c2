"""Which arrays may travel between ranks, and under which name (numbers only: never objects,
never pickles). Introduced in lessons/01."""

from __future__ import annotations

import numpy as np

#: dtypes that may travel on the wire (numbers only: never objects, never pickles)
WIRE_DTYPES = frozenset(np.dtype(t).name for t in (
    "float16", "float32", "float64", "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64"))
#: each of them as a dtype object (looking a dtype up by object skips NumPy's slow `dtype.name`)
DTYPE_OF = {name: np.dtype(name) for name in WIRE_DTYPES}
_NAME_OF = {dtype: name for name, dtype in DTYPE_OF.items()}


def wire_name(dtype: np.dtype) -> str | None:
    """The name `dtype` travels under, or None if it may not travel."""
    name = _NAME_OF.get(dtype)
    if name is None and dtype.name in WIRE_DTYPES:  # another byte order, say
        name = dtype.name
    return name


def as_shape(shape) -> tuple[int, ...]:
    """`shape` as a tuple of ints, an int as a 1-d shape (np.ndim on a tuple: 3 µs here)."""
    if isinstance(shape, tuple):
        return tuple(map(int, shape))
    return (int(shape),) if np.ndim(shape) == 0 else tuple(map(int, shape))


def check_array(array, what: str = "array") -> np.ndarray:
    """`array` as a C-contiguous NumPy array of a wire dtype (lists convert as np.asarray does)."""
    array = np.asarray(array)
    if wire_name(array.dtype) is None:
        raise TypeError(f"{what} has dtype {array.dtype}, which cannot travel between ranks; "
                        f"use one of {', '.join(sorted(WIRE_DTYPES))}")
    if not array.dtype.isnative:  # the wire names a dtype, not its byte order: travel native
        return array.astype(array.dtype.newbyteorder("="), order="C")
    return array if array.flags.c_contiguous else np.array(array, order="C")  # keeps 0-d arrays 0-d
