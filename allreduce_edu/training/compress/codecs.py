"""How a chunk of floats travels compressed: a codec encodes it into a wire array and decodes it.

    codec.encode(chunk) -> a wire array (float16, or uint8/uint16 bit patterns)
    codec.decode(wire)  -> float32, the values the receiver sees
    codec.nbytes(count) -> bytes of one encoded chunk of `count` values (what the trace counts)

FP16 and BF16 are casts (2 bytes a value). FP8 is e4m3 with one float32 scale per chunk, amax/448,
so the chunk's largest value lands on e4m3's largest: `count + 4` bytes, the scale's 4 bytes after
the codes in one uint8 array (one message per chunk). SIGN is 1-bit: the sign bits packed eight to
a byte (np.packbits) and one float32 scale, ‖x‖/√count (DeepSpeed's 1-bit Adam): `⌈count/8⌉ + 4`
bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .formats import (
    E4M3_MAX,
    as_float32,
    from_bf16_bits,
    from_e4m3_bits,
    to_bf16_bits,
    to_e4m3_bits,
)

SCALE_BYTES = 4  # one float32 scale per chunk


def _scale_bytes(scale) -> np.ndarray:
    return np.array([scale], np.float32).view(np.uint8)


def _split_scale(wire: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """(payload bytes, float32 scale) of a chunk whose last 4 bytes are its scale."""
    return wire[:-SCALE_BYTES], wire[-SCALE_BYTES:].copy().view(np.float32)[0]


@dataclass(frozen=True)
class Codec:
    """One wire encoding of float chunks: its name and bits per value."""

    name: str
    bits: int  # per value on the wire, scales aside

    def encode(self, chunk) -> np.ndarray:
        raise NotImplementedError

    def decode(self, wire: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def nbytes(self, count: int) -> int:
        return count * self.bits // 8

    def round(self, chunk) -> np.ndarray:
        """What the receiver sees of `chunk`: decode(encode(chunk)), float32."""
        return self.decode(self.encode(chunk))


class _FP16(Codec):
    def encode(self, chunk):
        return as_float32(chunk).astype(np.float16)

    def decode(self, wire):
        return np.asarray(wire, np.float16).astype(np.float32)


class _BF16(Codec):
    def encode(self, chunk):
        return to_bf16_bits(chunk)

    def decode(self, wire):
        return from_bf16_bits(wire)


class _FP8(Codec):
    def encode(self, chunk):
        chunk = as_float32(chunk)
        amax = float(np.max(np.abs(chunk))) if chunk.size else 0.0
        scale = np.float32(amax / E4M3_MAX if amax > 0 and np.isfinite(amax) else 1.0)
        return np.concatenate([to_e4m3_bits(chunk / scale), _scale_bytes(scale)])

    def decode(self, wire):
        codes, scale = _split_scale(np.asarray(wire, np.uint8))
        return from_e4m3_bits(codes) * scale

    def nbytes(self, count):
        return count + SCALE_BYTES


class _Sign(Codec):
    """x -> scale · sign(x), sign(0) = +1 (DeepSpeed's `sign().add_(1).bool()`)."""

    def encode(self, chunk):
        chunk = as_float32(chunk)
        scale = np.float32(np.linalg.norm(chunk) / np.sqrt(chunk.size) if chunk.size else 0.0)
        return np.concatenate([np.packbits(chunk >= 0), _scale_bytes(scale)])

    def decode(self, wire):
        packed, scale = _split_scale(np.asarray(wire, np.uint8))  # 8 values a byte: pad to 8
        return (np.unpackbits(packed).astype(np.float32) * 2 - 1) * scale

    def nbytes(self, count):
        return -(-count // 8) + SCALE_BYTES


FP16 = _FP16("fp16", 16)
BF16 = _BF16("bf16", 16)
FP8 = _FP8("fp8_e4m3", 8)
SIGN = _Sign("sign", 1)
