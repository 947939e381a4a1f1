"""Code-delta chunks (ckptcodecs.qdelta): exact round trips against a base, CodecError on bad bytes."""

from __future__ import annotations

import numpy as np
import pytest
from ckptcodecs import CodecError, encode_chunk, qdelta_decode, qdelta_encode, quantize

RNG = np.random.default_rng(7)
X0 = RNG.standard_normal((32, 48)).astype(np.float32)
X1 = X0 + 0.02 * RNG.standard_normal(X0.shape).astype(np.float32)


@pytest.mark.parametrize("method, bits, kw", [
    ("uniform-asymmetric", 4, {}),
    ("kmeans", 3, {"granularity": "tensor", "protect": 0.01, "protect_mode": "sparse"}),
    ("adaptive-asymmetric", 2, {"prune": 0.1, "protect": 0.01, "param_dtype": "float16"}),
])
def test_round_trip_is_exact(method, bits, kw):
    c0, p0 = quantize(X0, method, bits, **kw)
    c1, p1 = quantize(X1, method, bits, **kw)
    buf = qdelta_encode(c1, p1, c0, p0)
    assert buf[:3] == b"QD\x01"
    codes, params = qdelta_decode(buf, c0, p0)
    np.testing.assert_array_equal(codes, c1)
    assert encode_chunk(codes, params) == encode_chunk(c1, p1)


def test_bits_may_change_between_versions():
    c0, p0 = quantize(X0, "uniform-asymmetric", 2)
    c1, p1 = quantize(X1, "uniform-asymmetric", 5)
    codes, params = qdelta_decode(qdelta_encode(c1, p1, c0, p0), c0, p0)
    np.testing.assert_array_equal(codes, c1)
    assert params.bits == 5


def test_bad_bytes_raise_codec_error():
    c0, p0 = quantize(X0, "uniform-asymmetric", 4)
    c1, p1 = quantize(X1, "uniform-asymmetric", 4)
    buf = qdelta_encode(c1, p1, c0, p0)
    bad = [buf[:5], b"QX" + buf[2:], buf[:2] + b"\x02" + buf[3:], buf[:-7],
           buf[:40] + bytes(len(buf) - 40)]
    for b in bad:
        with pytest.raises(CodecError):
            qdelta_decode(b, c0, p0)
    c2, p2 = quantize(X0[:16], "uniform-asymmetric", 4)
    with pytest.raises(CodecError, match="base codes"):
        qdelta_decode(buf, c2, p2)
