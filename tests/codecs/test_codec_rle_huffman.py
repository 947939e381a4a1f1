"""RLEHuffman: exact roundtrips, raw fallback, sign-separated symbols, config and repr."""

from __future__ import annotations

import numpy as np
import pytest
from ckptcodecs import CodecError, RLEHuffman, rle_huffman_decode, rle_huffman_encode
from ckptcodecs import _hkernels as HK
from ckptcodecs.rle_huffman import SAMPLE_BLOCK, SAMPLE_BLOCKS, pays_to_code
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


def _codes(size: int, spread: float) -> np.ndarray:
    """Bytes like quantized codes: a rounded normal around 128 (spread 40: ~7.3 bits of
    entropy, a Huffman code saves ~7 %; spread 6: ~4.6 bits)."""
    return RNG.normal(128, spread, size).round().clip(0, 255).astype(np.uint8)


@pytest.mark.parametrize("shuffle_blocks", [False, True])
def test_min_saving_stores_raw_where_a_sample_says_coding_saves_less(shuffle_blocks):
    """``min_saving``: a buffer whose sample says Huffman coding saves less than that share is
    stored raw without coding (mode 0, decoded as before); one that saves more, or whose
    runs RLE codes, or too small to sample, is coded as without it; the sample's verdict
    agrees with what coding the whole saves."""
    n = 1 << 18
    flat = _codes(n, 40)  # coding saves ~7 %
    coded = rle_huffman_encode(flat)
    saving = 1 - len(coded) / (n + 10)
    assert 0.04 < saving < 0.10 and coded[1] == 1
    if shuffle_blocks:  # the sample's blocks from another order of the same bytes
        flat = flat.reshape(64, -1)[RNG.permutation(64)].reshape(-1)
    for min_saving, raw in ((saving - 0.02, False), (saving + 0.02, True)):
        enc = rle_huffman_encode(flat, min_saving)
        assert (enc[1] == 0) == raw
        np.testing.assert_array_equal(rle_huffman_decode(enc), flat)
    assert pays_to_code(flat, saving - 0.02) and not pays_to_code(flat, saving + 0.02)
    narrow = _codes(n, 6)  # saves ~40 %
    runs = np.repeat(_codes(n // 16, 40), 16)  # every byte 16 times: RLE pays, Huffman not
    small = flat[:4 * SAMPLE_BLOCKS * SAMPLE_BLOCK - 1]
    for data in (narrow, runs, small):
        assert rle_huffman_encode(data, 0.08) == rle_huffman_encode(data)
    assert len(rle_huffman_encode(runs, 0.5)) < n / 4
    with pytest.raises(ValueError, match="min_saving"):
        rle_huffman_encode(flat, 1.0)


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


def _heap_code_lengths(freq: np.ndarray) -> np.ndarray:
    """The reference: Huffman over a binary heap of ``(weight, index)`` pairs, frequencies
    halved (rounding up) until the longest code fits MAX_LEN (what the encoder did in Python
    before it was compiled; stored bytes must not change)."""
    import heapq

    f = freq.astype(np.int64)
    while True:
        n = f.size
        if n == 1:
            return np.ones(1, np.int64)
        heap = [(int(w), i) for i, w in enumerate(f)]
        heapq.heapify(heap)
        parent = np.zeros(2 * n - 1, np.int64)
        nxt = n
        while len(heap) > 1:
            w1, a = heapq.heappop(heap)
            w2, b = heapq.heappop(heap)
            parent[a] = parent[b] = nxt
            heapq.heappush(heap, (w1 + w2, nxt))
            nxt += 1
        depth = np.zeros(2 * n - 1, np.int64)
        for node in range(2 * n - 3, -1, -1):
            depth[node] = depth[parent[node]] + 1
        if depth[:n].max() <= HK.MAX_LEN:
            return depth[:n]
        f = (f + 1) // 2


def _fibonacci(n: int) -> np.ndarray:
    fib = [1, 1]
    while len(fib) < n:
        fib.append(fib[-1] + fib[-2])
    return np.array(fib[:n], np.int64)


@pytest.mark.parametrize("case", range(40))
def test_compiled_code_lengths_equal_the_heap_construction(case):
    rng = np.random.default_rng(case)
    n = int(rng.integers(1, 600))
    freq = {0: lambda: rng.integers(1, 1000, n), 1: lambda: rng.integers(1, 4, n),
            2: lambda: (rng.zipf(1.2, n) * rng.integers(1, 50)).clip(1, 1 << 40),
            3: lambda: _fibonacci(min(n, 60))}[case % 4]().astype(np.int64)
    lens = np.empty(freq.size, np.int64)
    HK.code_lengths(freq, lens)
    assert np.array_equal(lens, _heap_code_lengths(freq))
    assert lens.max() <= HK.MAX_LEN and (2.0 ** -lens.astype(float)).sum() <= 1.0
