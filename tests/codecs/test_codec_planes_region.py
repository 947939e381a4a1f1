"""BytePlanes region decodes: a block of rows and columns put together straight into an array of
any strides equals the same block of the whole decode, for every item size; bad blocks, outs
and payloads are refused; threads decoding at once keep their own scratch."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from ckptcodecs import CodecError, planes_decode, planes_encode
from ckptcodecs._floats import to_bf16_bits
from ckptcodecs.planes import planes_decode_region

RNG = np.random.default_rng(5)
W = (RNG.standard_normal(24_000) * 0.05).astype(np.float32)
ARRAYS = {
    "f32": W,
    "bf16": to_bf16_bits(W),
    "f64": W.astype(np.float64),
    "uint8": RNG.integers(0, 4, W.size).astype(np.uint8),
    "bool": RNG.random(W.size) < 0.1,
    "zero-rows": np.where(RNG.random((W.size // 40, 1)) < 0.5, 0, W.reshape(-1, 40)).ravel(),
}
SHAPES = [(24_000,), (600, 40), (300, 10, 8)]
BLOCKS = [((0, None), (0, None)), ((17, 401), (3, 9)), ((0, 1), (0, 1)), ((5, 5), (0, 4)),
          ((599, None), (0, None))]


def _block(shape, rows, cols):
    r = (min(rows[0], shape[0]), shape[0] if rows[1] is None else min(rows[1], shape[0]))
    if len(shape) == 1:
        return r, (0, 1), (slice(*r),)
    c = (cols[0], shape[1] if cols[1] is None else min(cols[1], shape[1]))
    return r, c, (slice(*r), slice(*c))


@pytest.mark.parametrize("name", list(ARRAYS))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_region_equals_the_block_of_the_whole_decode(name, shape, block):
    x = ARRAYS[name].reshape(shape)
    enc = planes_encode(x, x.dtype.itemsize, block=4096)
    rows, cols, index = _block(shape, *block)
    want = x[index]
    out = np.full(want.shape, 7, x.dtype)
    planes_decode_region(enc, shape, rows, cols, out)
    np.testing.assert_array_equal(out.view(np.uint8), want.view(np.uint8))
    # into a slice of a larger array (rows of another pitch) and into a transposed view (runs
    # that are not contiguous: through a buffer)
    big = np.zeros((want.shape[0] + 3, *[d + 5 for d in want.shape[1:2]], *want.shape[2:]),
                   x.dtype)
    into = big[(slice(2, 2 + want.shape[0]), *[slice(1, 1 + d) for d in want.shape[1:2]])]
    planes_decode_region(enc, shape, rows, cols, into)
    np.testing.assert_array_equal(into.view(np.uint8), want.view(np.uint8))
    assert not big[:2].any() and not big[2 + want.shape[0]:].any()  # nothing written outside
    if want.ndim > 1:
        t = np.zeros(want.shape[::-1], x.dtype).T
        planes_decode_region(enc, shape, rows, cols, t)
        np.testing.assert_array_equal(np.ascontiguousarray(t).view(np.uint8), want.view(np.uint8))


def test_bad_blocks_and_outs_are_refused():
    x = W.reshape(600, 40)
    enc = planes_encode(x, 4)
    with pytest.raises(ValueError, match="outside"):
        planes_decode_region(enc, (600, 40), (0, 601), (0, 40), np.empty((601, 40), np.float32))
    with pytest.raises(ValueError, match="outside"):
        planes_decode_region(enc, (600, 40), (0, 10), (30, 41), np.empty((10, 11), np.float32))
    with pytest.raises(CodecError, match="not an array of shape"):
        planes_decode_region(enc, (601, 40), (0, 10), (0, 40), np.empty((10, 40), np.float32))
    with pytest.raises(CodecError, match="4-byte items"):
        planes_decode_region(enc, (600, 40), (0, 10), (0, 40), np.empty((10, 40), np.float64))
    with pytest.raises(ValueError, match="writable"):
        ro = np.empty((10, 40), np.float32)
        ro.flags.writeable = False
        planes_decode_region(enc, (600, 40), (0, 10), (0, 40), ro)
    with pytest.raises(CodecError):
        planes_decode_region(enc[:-3], (600, 40), (0, 10), (0, 40), np.empty((10, 40), np.float32))


def test_threads_decoding_at_once_keep_their_own_scratch():
    # every plane coded (Huffman / zstd): all of them go through the thread's scratch buffer
    arrays = [(RNG.integers(0, 3, (400, 64)) * (k + 1)).astype(np.float32) for k in range(8)]
    encoded = [planes_encode(a, 4) for a in arrays]

    def check(k: int) -> bool:
        out = np.empty((400, 32), np.float32)
        for _ in range(20):
            planes_decode_region(encoded[k], (400, 64), (0, 400), (16, 48), out)
            if not np.array_equal(out, arrays[k][:, 16:48]):
                return False
            if not np.array_equal(planes_decode(encoded[k]).view(np.float32),
                                  arrays[k].ravel()):
                return False
        return True

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(check, range(8)))
