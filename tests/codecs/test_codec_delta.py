"""BucketDelta: exact inverse, cyclic residuals, bucket rearrangement, level changes."""

from __future__ import annotations

import numpy as np
import pytest
from ckptcodecs import (
    BucketDelta,
    CodecError,
    delta_decode,
    delta_encode,
    dequantize,
    quantize,
    rle_huffman_encode,
)

RNG = np.random.default_rng(11)


def _versions(n=20_000, k=16, migrate=0.05):
    base = RNG.integers(0, k, n).astype(np.uint8)
    new = base.copy()
    m = RNG.random(n) < migrate
    new[m] = (base[m] + RNG.choice([-1, 1], m.sum())) % k
    return base, new


def test_roundtrip_and_cyclic_range():
    base, new = _versions()
    res = delta_encode(new, base, 16)
    assert res.dtype == np.uint8 and res.max() < 16
    np.testing.assert_array_equal(delta_decode(res, base, 16), new)
    assert set(np.unique(res)) <= {0, 1, 15}  # -1 mod 16 == 15


def test_rearranged_by_base_bucket_stably():
    base = np.array([2, 0, 1, 0, 2, 1, 0], np.uint8)
    new = np.array([2, 1, 1, 0, 0, 2, 3], np.uint8)
    res = delta_encode(new, base, 4)
    order = np.argsort(base, kind="stable")
    np.testing.assert_array_equal(res, (new[order].astype(int) - base[order]) % 4)


def test_rearrangement_helps_rle_huffman():
    # bucket 0 migrates a lot, the others never: interleaved, its changes break every run
    base = RNG.integers(0, 8, 200_000).astype(np.uint8)
    new = base.copy()
    hot = base == 0
    new[hot] = RNG.integers(0, 8, hot.sum())
    plain = ((new.astype(int) - base) % 8).astype(np.uint8)
    bucketed = delta_encode(new, base, 8)
    assert len(rle_huffman_encode(bucketed)) < 0.5 * len(rle_huffman_encode(plain))


def test_levels_change_between_versions():
    x0 = RNG.standard_normal(5000).astype(np.float32)
    x1 = x0 + 0.01 * RNG.standard_normal(5000).astype(np.float32)
    c0, p0 = quantize(x0, "kmeans", 3, granularity="tensor", levels=5, protect=0.01)
    c1, p1 = quantize(x1, "kmeans", 4, granularity="tensor", protect=0.01, prune=0.1)
    k = (p0.levels, p1.levels)
    res = delta_encode(c1, c0, k)
    back = delta_decode(res, c0, k)
    np.testing.assert_array_equal(back, c1)
    # the new version's protected values travel in its own params
    np.testing.assert_array_equal(dequantize(back, p1), dequantize(c1, p1))


def test_codec_form_and_errors():
    base, new = _versions(1000)
    codec = BucketDelta(16, base=base)
    assert (codec.decode(codec.encode(new)) == new).all()
    assert repr(codec) == "BucketDelta(levels=16)"
    assert codec.get_config() == {"id": "ckpt.bucket_delta", "levels": 16}
    with pytest.raises(CodecError, match="base"):
        BucketDelta(16).encode(new)
    with pytest.raises(CodecError):
        delta_encode(new, base[:-1], 16)
    with pytest.raises(CodecError):
        delta_encode(new, base, 4)  # codes beyond K
    with pytest.raises(CodecError):
        delta_decode(np.zeros(3, np.uint8), np.zeros(3, np.uint8), 300)
    with pytest.raises(CodecError):
        codec.decode(codec.encode(new)[:-1])
    assert delta_encode(np.zeros(0, np.uint8), np.zeros(0, np.uint8), 4).size == 0
