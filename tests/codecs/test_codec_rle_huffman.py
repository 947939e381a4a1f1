"""RLEHuffman: exact roundtrips, raw fallback, sign-separated symbols, config and repr."""

from __future__ import annotations

import numpy as np
import pytest
from ckptcodecs import CodecError, RLEHuffman, rle_huffman_decode, rle_huffman_encode
from ckptcodecs import _hkernels as HK
from common import check_config, check_encode_decode, check_repr

RNG = np.random.default_rng(3)


def _exact(arr, dec):
    np.testing.assert_array_equal(dec.view(arr.dtype) if dec.dtype != arr.dtype else dec, arr)


CASES = {
    "empty": np.zeros(0, np.uint8),
    "one": np.array([42], np.uint8),
    "one-symbol-long": np.full(100_000, 9, np.uint8),
    "all-distinct": np.arange(256, dtype=np.uint8),
    "random": RNG.integers(0, 256, 50_000).astype(np.uint8),
    "few-values": RNG.integers(0, 3, 50_000).astype(np.uint8),
    "runs": np.repeat(RNG.integers(0, 6, 2000), RNG.integers(1, 100, 2000)).astype(np.uint8),
    "run-longer-than-max": np.concatenate([np.zeros(HK.MAX_RUN * 2 + 1, np.uint8),
                                           np.ones(HK.MAX_RUN + 1, np.uint8)]),
    "sparse": (RNG.random(200_000) < 0.01).astype(np.uint8) * 5,
    "int16": RNG.integers(-3, 3, 5000).astype(np.int16),
}


@pytest.mark.parametrize("name", list(CASES))
def test_roundtrip_exact(name):
    check_encode_decode(CASES[name], RLEHuffman(), _exact)


def test_stores_raw_when_coding_expands():
    data = CASES["random"]
    enc = rle_huffman_encode(data)
    assert enc[1] == 0 and len(enc) == data.size + 10
    assert rle_huffman_encode(b"")[1] == 0


def test_compresses_runs_and_skewed_data():
    assert len(rle_huffman_encode(CASES["one-symbol-long"])) < 40
    assert len(rle_huffman_encode(CASES["sparse"])) < CASES["sparse"].size / 10
    few = rle_huffman_encode(CASES["few-values"])
    assert len(few) < CASES["few-values"].size * 2.2 / 8  # entropy 1.58 bits, runs cost some


def test_symbol_stream_uses_runs_only_beyond_one():
    data = np.array([3, 3, 3, 1, 2, 2], np.uint8)
    syms = np.empty(data.size, np.uint16)
    freq = np.zeros(HK.ALPHABET, np.int64)
    m = HK.rle_scan(data, syms, freq)
    # value 3, run 3, value 1, value 2, run 2 (run r -> index RUN_BASE + r)
    assert syms[:m].tolist() == [3, HK.RUN_BASE + 3, 1, 2, HK.RUN_BASE + 2]


def test_long_codes_beyond_lookup_table():
    # geometric frequencies force code lengths beyond LUT_BITS (and the length limit)
    parts = [np.full(2 ** k, k, np.uint8) for k in range(20)]
    data = np.concatenate(parts)
    data = data[RNG.permutation(data.size)]
    assert (rle_huffman_decode(rle_huffman_encode(data)) == data).all()


def test_bad_version_and_mode():
    enc = bytearray(rle_huffman_encode(CASES["few-values"]))
    enc[0] = 2
    with pytest.raises(CodecError, match="version"):
        rle_huffman_decode(bytes(enc))
    enc[0], enc[1] = 1, 7
    with pytest.raises(CodecError, match="mode"):
        rle_huffman_decode(bytes(enc))


def test_config_and_repr():
    check_config(RLEHuffman())
    check_repr("RLEHuffman()")
