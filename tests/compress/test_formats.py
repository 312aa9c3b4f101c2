"""bf16 and FP8 e4m3 in NumPy, bit for bit: every code round-trips, ties go to even, e4m3
saturates at ±448, NaN stays NaN; and each equals torch's cast where torch is installed."""

from __future__ import annotations

import numpy as np
import pytest

from allreduce_edu.training.compress.codecs import BF16, FP8, FP16, SIGN
from allreduce_edu.training.compress.formats import (
    E4M3_MAX,
    from_bf16_bits,
    from_e4m3_bits,
    to_bf16_bits,
    to_e4m3_bits,
)

CODES = np.arange(256, dtype=np.uint8)
VALUES = from_e4m3_bits(CODES)
FINITE = np.isfinite(VALUES)


def samples() -> np.ndarray:
    """Random values over many scales, every e4m3 value, the midpoints between them, edges."""
    rng = np.random.default_rng(0)
    spread = [rng.normal(size=20_000) * s for s in (1e-4, 1e-2, 1, 30, 1000)]
    values = np.sort(VALUES[FINITE].astype(np.float64))
    mids = (values[:-1] + values[1:]) / 2
    edges = [1e30, -1e30, np.inf, -np.inf, 2.0 ** -10, 2.0 ** -11, 0.0, -0.0, 464.0, 465.0]
    return np.concatenate(spread + [values, mids, edges]).astype(np.float32)


def test_e4m3_has_253_finite_values_up_to_448_and_round_trips_each():
    assert FINITE.sum() == 254 and np.isnan(VALUES[0x7F]) and np.isnan(VALUES[0xFF])
    assert VALUES[0x7E] == E4M3_MAX and VALUES[0x01] == 2.0 ** -9  # the smallest subnormal
    codes = CODES[FINITE]
    assert np.array_equal(to_e4m3_bits(VALUES[FINITE]), codes)  # ±0 keep their sign bit


def test_e4m3_rounds_to_nearest_ties_to_even_and_saturates():
    assert to_e4m3_bits(np.float32(1.0625)) == to_e4m3_bits(np.float32(1.0))  # tie: even code
    assert to_e4m3_bits(np.float32(1.1875)) == to_e4m3_bits(np.float32(1.25))  # tie: even code
    assert to_e4m3_bits(np.float32(2.0 ** -10)) == 0  # half the smallest subnormal: to 0
    for big in (449.0, 1e6, np.inf):
        assert from_e4m3_bits(to_e4m3_bits(np.float32(big))) == 448.0
        assert from_e4m3_bits(to_e4m3_bits(np.float32(-big))) == -448.0
    assert np.isnan(from_e4m3_bits(to_e4m3_bits(np.float32(np.nan))))


def test_bf16_keeps_the_top_16_bits_rounded_to_nearest_even():
    x = samples()
    bits = to_bf16_bits(x)
    assert bits.dtype == np.uint16
    y = from_bf16_bits(bits)
    finite = np.isfinite(x) & (np.abs(x) < 3e38)
    np.testing.assert_allclose(y[finite], x[finite], rtol=2.0 ** -8)
    assert np.array_equal(to_bf16_bits(y), bits)  # bf16 values are fixed points
    one_and_half_ulp = np.float32(1 + 2.0 ** -8)  # halfway between 1 and the next bf16: even
    assert from_bf16_bits(to_bf16_bits(one_and_half_ulp)) == 1.0
    assert np.isnan(from_bf16_bits(to_bf16_bits(np.float32(np.nan))))
    assert from_bf16_bits(to_bf16_bits(np.float32(3.4e38))) == np.inf  # past bf16's largest


def test_the_formats_equal_torch_s_casts_bit_for_bit():
    torch = pytest.importorskip("torch")
    x = samples()
    theirs = torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert np.array_equal(to_e4m3_bits(x), theirs)
    decoded = torch.from_numpy(CODES.copy()).view(torch.float8_e4m3fn).float().numpy()
    assert np.array_equal(VALUES, decoded, equal_nan=True)
    real = ~np.isnan(x)  # torch's vectorised cast writes another NaN pattern (still a NaN)
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(to_bf16_bits(x)[real], theirs[real])
    wide = np.random.default_rng(1).normal(size=10_000) * 1e3  # float64 -> fp16 via float32
    assert np.array_equal(FP16.encode(wide), torch.from_numpy(wide).to(torch.float16).numpy())


@pytest.mark.parametrize("count", [0, 1, 7, 8, 1001])
def test_each_codec_s_bytes_are_its_formula(count):
    x = np.random.default_rng(count).normal(size=count).astype(np.float32)
    for codec, formula in ((FP16, 2 * count), (BF16, 2 * count), (FP8, count + 4),
                           (SIGN, -(-count // 8) + 4)):
        assert codec.encode(x).nbytes == codec.nbytes(count) == formula, codec.name


def test_fp8_scales_each_chunk_so_its_largest_value_lands_on_448():
    x = np.array([0.5, -3.0, 1.0, 0.25], np.float32)
    wire = FP8.encode(x)
    assert from_e4m3_bits(wire[:-4]).max() == 448.0 or from_e4m3_bits(wire[:-4]).min() == -448.0
    np.testing.assert_allclose(FP8.round(x), x, rtol=2.0 ** -4)
    assert np.array_equal(FP8.round(np.zeros(3, np.float32)), np.zeros(3))  # no 0/0


def test_sign_sends_the_sign_and_the_root_mean_square():
    x = np.array([3.0, -4.0, 0.0, -1e-9, 2.0, 1.0, -1.0, 5.0], np.float32)
    got = SIGN.round(x)
    scale = np.sqrt(np.mean(x.astype(np.float64) ** 2))
    np.testing.assert_allclose(got, scale * np.where(x >= 0, 1, -1), rtol=1e-6)
