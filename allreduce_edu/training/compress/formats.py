"""bfloat16 and FP8 (e4m3fn) in plain NumPy, bit for bit: the wire carries their bit patterns.

NumPy has float16 but neither bfloat16 nor float8, and the wire carries only numeric NumPy dtypes
(comm/base.py WIRE_DTYPES), so a bf16 value travels as its uint16 bits and an e4m3 value as its
uint8 bits. Rounding is round-to-nearest-even, as PyTorch's CPU casts do (c10/util/BFloat16.h,
Float8_e4m3fn.h); tests/compress/test_formats.py checks every bit against torch where it is there.

    bits = to_bf16_bits(x)        # float32 -> uint16: the top 16 bits, rounded to nearest even
    x16 = from_bf16_bits(bits)    # uint16 -> float32, exactly
    code = to_e4m3_bits(x)        # float32 -> uint8: 1 sign, 4 exponent (bias 7), 3 mantissa bits
    x8 = from_e4m3_bits(code)     # uint8 -> float32, exactly; 0x7f / 0xff are NaN, no infinity
"""

from __future__ import annotations

import numpy as np

BF16_NAN = np.uint16(0x7FC0)  # the quiet NaN c10::BFloat16 rounds NaN to
E4M3_MAX = 448.0  # the largest finite e4m3fn value: 1.75 · 2^8 (S.1111.110)
E4M3_NAN = np.uint8(0x7F)  # S.1111.111 is NaN; e4m3fn ("finite") has no infinity


def as_float32(x) -> np.ndarray:
    """x as float32, as torch casts: float64 rounds to float32 first (so casts agree with torch)."""
    x = np.asarray(x)
    if x.dtype.kind != "f":
        raise TypeError(f"compression works on floating-point gradients, got dtype {x.dtype}")
    return x.astype(np.float32, copy=False)


def to_bf16_bits(x) -> np.ndarray:
    """bfloat16 bit patterns (uint16) of x: float32's top half, rounded to nearest, ties to even."""
    u = as_float32(x).view(np.uint32).astype(np.uint64)  # uint64: the rounding carry has room
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(as_float32(x)), BF16_NAN, rounded)


def from_bf16_bits(bits) -> np.ndarray:
    """The float32 values of bfloat16 bit patterns (exact: bf16 is float32 with 16 bits dropped)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def _e4m3_table() -> np.ndarray:
    """The float32 value of every e4m3fn code 0..127 (sign bit clear); code 127 is NaN."""
    code = np.arange(128)
    exponent, mantissa = code >> 3, code & 7
    values = np.where(exponent == 0, mantissa / 8 * 2.0 ** -6,  # subnormal: 0.mmm · 2^-6
                      (1 + mantissa / 8) * 2.0 ** (exponent - 7))  # normal: 1.mmm · 2^(e-7)
    values[127] = np.nan
    return values.astype(np.float32)


E4M3_VALUES = _e4m3_table()  # code -> value, codes 0..126 increasing


def to_e4m3_bits(x) -> np.ndarray:
    """e4m3fn codes (uint8) of x: the nearest of the 253 finite values, ties to the even code;
    beyond ±448 it saturates to ±448 (as torch's cast and FP8 kernels clamp); NaN stays NaN."""
    x = as_float32(x)
    a = np.minimum(np.abs(x).astype(np.float64), E4M3_MAX)  # magnitudes; NaN stays NaN
    finite = E4M3_VALUES[:127].astype(np.float64)
    hi = np.minimum(np.searchsorted(finite, np.nan_to_num(a)), 126)  # first value >= a
    lo = np.maximum(hi - 1, 0)
    below, above = a - finite[lo], finite[hi] - a  # distances to the two neighbours (exact)
    up = (above < below) | ((above == below) & (hi % 2 == 0))  # nearest; a tie goes to even
    code = np.where(up, hi, lo).astype(np.uint8)
    code = np.where(np.isnan(a), E4M3_NAN, code)
    return code | (np.signbit(x).astype(np.uint8) << 7)


def from_e4m3_bits(code) -> np.ndarray:
    """The float32 values of e4m3fn codes (exact)."""
    code = np.asarray(code, np.uint8)
    magnitude = E4M3_VALUES[code & 0x7F]
    return np.where(code & 0x80, -magnitude, magnitude).astype(np.float32)
