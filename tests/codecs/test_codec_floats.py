"""The compiled float conversions give numpy's bits (float16) and the bfloat16 rounding rule's bits
on every exponent, sign, tie and special value (the whole float32 range was compared once, see
docs/benchmarks.md); the compiled 16-bit residual sum gives the bits of its numpy steps."""

from __future__ import annotations

import numpy as np
import pytest
from ckptcodecs import CodecError
from ckptcodecs._floats import (
    add_rounded,
    add_rounded_numpy,
    bf16_bits_numpy,
    float16_values,
    from_bf16_bits,
    to_bf16_bits,
    to_float16,
)


def _bits_with_low(top_bits: int, lows: list[int]) -> np.ndarray:
    """Every float32 bit pattern whose top ``top_bits`` bits take every value and whose low bits
    are each of ``lows``: each exponent, sign and high mantissa, at the rounding ties."""
    shift = 32 - top_bits
    top = np.arange(1 << top_bits, dtype=np.uint32) << np.uint32(shift)
    return (top[:, None] | np.array(lows, np.uint32)[None, :]).reshape(-1)


def _subnormal_ties() -> np.ndarray:
    """float32 values that round to float16 subnormals, at and next to each tie (the rounding
    bit moves with the exponent), and random ones of that range."""
    rng = np.random.default_rng(0)
    out = [rng.integers(0, 0x38800000, 1 << 18, dtype=np.uint32)]
    for e in range(100, 113):  # biased float32 exponents below float16's normal range
        s = 126 - e  # bits of the 24-bit significand cut off
        k = rng.integers(0, 1 << max(0, 24 - s), 4096).astype(np.uint64)
        sig = (k << np.uint64(s)) | np.uint64(1 << (s - 1))  # exactly half way
        for d in (-1, 0, 1):
            m = (sig.astype(np.int64) + d) & 0xFFFFFF
            out.append((np.uint32(e) << np.uint32(23)) | (m & 0x7FFFFF).astype(np.uint32))
    u = np.concatenate(out)
    return np.concatenate([u, u | np.uint32(0x80000000)])


def test_float16_values_of_every_half_are_numpys():
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    with np.errstate(all="ignore"):
        expected = h.astype(np.float32).view(np.uint32)
    got = float16_values(h)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32), expected)


@pytest.mark.parametrize("name", ["ties", "subnormal"])
def test_to_float16_gives_numpys_bits(name):
    if name == "ties":  # around float16's rounding bit (bit 12) in every exponent and sign
        u = _bits_with_low(19, [0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF])
    else:
        u = _subnormal_ties()
    f = u.view(np.float32)
    with np.errstate(all="ignore"):
        expected = f.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(to_float16(f).view(np.uint16), expected)


def test_to_bf16_bits_follows_the_rule_at_every_tie():
    u = _bits_with_low(16, [0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF])
    f = u.view(np.float32)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(to_bf16_bits(f), bf16_bits_numpy(f))


def test_special_values():
    f = np.array([np.inf, -np.inf, np.nan, -np.nan, 65504, 65520, -65520, 3.4e38, -3.4e38,
                  0.0, -0.0, 2.0 ** -25, 2.0 ** -24], np.float32)
    with np.errstate(all="ignore"):
        half = to_float16(f)
    assert np.isinf(half[:2]).all() and np.isnan(half[2:4]).all()
    np.testing.assert_array_equal(half[4:].astype(np.float32),
                                  [65504, np.inf, -np.inf, np.inf, -np.inf, 0, -0.0, 0,
                                   2.0 ** -24])
    assert np.signbit(half[10])
    bf = from_bf16_bits(to_bf16_bits(f))
    assert np.isinf(bf[:2]).all() and np.isnan(bf[2:4]).all()
    assert np.isfinite(bf[7:9]).all() and bf[7] == -bf[8] > 3.38e38  # saturated, not inf


@pytest.mark.parametrize("fn, dtype", [(to_float16, np.float32), (to_bf16_bits, np.float32),
                                       (float16_values, np.float16)])
def test_shapes_strides_and_byte_order_are_kept(fn, dtype):
    x = np.arange(24, dtype=np.float32).reshape(4, 6).astype(dtype)
    for a in (x, x[:, ::2], x.astype(x.dtype.newbyteorder(">")), x[:0], x[0, 0]):
        got = fn(a)
        assert got.shape == np.shape(a)
        values = from_bf16_bits(got) if fn is to_bf16_bits else got.astype(np.float64)
        np.testing.assert_array_equal(values, np.asarray(a, np.float64))


def test_other_dtypes_round_once_through_numpy():
    x = np.array([1 + 2.0 ** -11 + 2.0 ** -40], np.float64)  # just above a float16 tie
    assert to_float16(x)[0] == x.astype(np.float16)[0] == np.float16(1 + 2.0 ** -10)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_add_rounded_gives_the_bits_of_the_numpy_steps(dtype):
    rng = np.random.default_rng(3)
    host = np.uint16 if dtype == "bfloat16" else np.float16
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)  # each value, against
    pairs = [(every, rng.permutation(every)), (every, every), (every, every ^ np.uint16(0x8000)),
             (rng.integers(0, 1 << 16, 1 << 20, dtype=np.uint16),  # any bits at all
              rng.integers(0, 1 << 16, 1 << 20, dtype=np.uint16))]
    top = np.uint16(0x7F7F if dtype == "bfloat16" else 0x7BFF)  # largest finite: overflows
    pairs.append((np.full(4, top), np.array([top, top ^ 0x8000, 0x3F80, 0x7F80], np.uint16)))
    for a, b in pairs:
        a, b = a.view(host), b.view(host)
        got, expected = add_rounded(a, b, dtype), add_rounded_numpy(a, b, dtype)
        assert got.dtype == host and got.shape == a.shape
        got_nan = np.isnan(from_bf16_bits(got) if dtype == "bfloat16" else got)
        want_nan = np.isnan(from_bf16_bits(expected) if dtype == "bfloat16" else expected)
        np.testing.assert_array_equal(got_nan, want_nan)  # NaN + NaN: either payload
        np.testing.assert_array_equal(got.view(np.uint16)[~got_nan],
                                      expected.view(np.uint16)[~want_nan])


def test_add_rounded_into_out_and_bad_input():
    a = to_bf16_bits(np.linspace(-3, 3, 48, dtype=np.float32)).reshape(6, 8)
    out = np.zeros((6, 16), np.uint16)[:, ::2]  # not contiguous: through a buffer
    assert add_rounded(a, a, "bfloat16", out) is out
    np.testing.assert_array_equal(from_bf16_bits(out), 2 * from_bf16_bits(a))
    same = a.copy()
    assert add_rounded(same, a, "bfloat16", same) is same  # in place
    np.testing.assert_array_equal(same, out)
    h = np.arange(1, 49, dtype=np.float16).reshape(6, 8)
    rows = np.zeros((8, 8), np.float16)
    add_rounded(h[1:3], h[1:3], "float16", rows[2:4])  # into a block of rows
    np.testing.assert_array_equal(rows[2:4], 2 * h[1:3])
    assert not rows[:2].any() and not rows[4:].any()
    big = h.astype(h.dtype.newbyteorder(">"))  # bytes swapped: read as values, not as bits
    np.testing.assert_array_equal(add_rounded(big, big, "float16"), 2 * h)
    buf = np.zeros(64, np.float16)
    with pytest.raises(ValueError, match="broadcast"):
        add_rounded(h, h, "float16", buf[:2])  # too small: refused, nothing written past it
    assert not buf.any()
    frozen = np.zeros_like(h)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        add_rounded(h, h, "float16", frozen)
    with pytest.raises(CodecError, match="float16 values"):
        float16_values(np.ones(3, np.float32))
    with pytest.raises(ValueError, match="one shape"):
        add_rounded(a, a[:2], "bfloat16")
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        add_rounded(a.astype(np.float32), a, "bfloat16")
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        add_rounded(a, a, "float32")
