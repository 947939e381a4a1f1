"""Dense bit packing."""

from __future__ import annotations

import numpy as np
import pytest
from ckptcodecs import CodecError, pack_bits, packed_size, unpack_bits


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1001])
def test_roundtrip(bits, n):
    codes = np.random.default_rng(bits * 1000 + n).integers(0, 1 << bits, n).astype(np.uint8)
    packed = pack_bits(codes, bits)
    assert packed.size == packed_size(n, bits) == (n * bits + 7) // 8
    np.testing.assert_array_equal(unpack_bits(packed, bits, n), codes)


def test_layout_is_little_endian_bit_stream():
    assert pack_bits(np.array([1, 2, 3], np.uint8), 3).tolist() == [0b11010001, 0b0]
    assert pack_bits(np.array([0xA, 0x5], np.uint8), 4).tolist() == [0x5A]


def test_errors():
    with pytest.raises(CodecError):
        pack_bits(np.zeros(3, np.uint8), 9)
    with pytest.raises(CodecError, match="truncated"):
        unpack_bits(np.zeros(1, np.uint8), 3, 5)
