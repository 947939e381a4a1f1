"""BytePlanes' whole-payload decoder (``planes_decode_into``, planes_whole.c) against the steps
it replaces (parse, each plane decoded, the items merged: ``_planes_decode`` with the C call
switched off): the same bytes for every layout it takes -- items of 2, 4 and 8 bytes, raw and
Huffman planes, one block or many, a raw tail -- on every CPU path; every other payload
(zstd planes, one-byte items, flipped, truncated or random bytes, an output of another size,
misaligned or overlapping the payload) left to the steps (status 1), never a crash.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptcodecs import CodecError, _backend
from ckptcodecs import _planes_decode as PD
from ckptcodecs import planes as P

pytestmark = [pytest.mark.skipif(_backend.native() is None or _backend.CHOICE != "c",
                                 reason="ckptcodecs' compiled kernels are not in use"),
              pytest.mark.usefixtures("each_simd_path")]  # every CPU path

DTYPES = st.sampled_from([np.float32, np.float16, np.uint16, np.float64, np.int32])
BLOCKS = st.sampled_from([1024, 4099, 1 << 17])
SEEDS = st.integers(0, 2**32 - 1)


def _into():
    """The kernel, with a scratch of 1 MiB (a 128 KiB block of each of up to 8 planes)."""
    kernel = _backend.native().planes_decode_into
    return lambda enc, out, scratch=None: kernel(
        enc, out, np.empty(1 << 20, np.uint8) if scratch is None else scratch)


def _values(seed: int, n: int, dtype, tail: int) -> np.ndarray:
    """``n`` numbers like trained weights (skewed exponents: Huffman planes; noisy mantissas:
    raw ones), as bytes, and ``tail`` bytes more."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * rng.choice([0.02, 1.0, 300.0])).astype(dtype)
    return np.concatenate([x.view(np.uint8), rng.integers(0, 256, tail, np.uint8)])


def _taken(enc: np.ndarray) -> bool:
    """Whether the one call takes this (well-formed) payload: raw and Huffman planes only."""
    return all(method in (P.RAW, P.HUFFMAN) for method, _, _ in PD._parse(enc)[5])


def _steps(payload: np.ndarray, nbytes: int) -> np.ndarray:
    """What planes_decode's steps give (the whole-payload call switched off)."""
    saved, PD._INTO = PD._INTO, None
    try:
        out = np.zeros(nbytes, np.uint8)
        PD.planes_decode(payload, out)
        return out
    finally:
        PD._INTO = saved


@settings(max_examples=60, deadline=None)
@given(dtype=DTYPES, n=st.one_of(st.integers(0, 300), st.integers(1, 40000)),
       tail=st.integers(0, 7), block=BLOCKS, seed=SEEDS)
def test_same_bytes_as_the_steps(dtype, n, tail, block, seed):
    itemsize = np.dtype(dtype).itemsize
    data = _values(seed, n, dtype, tail % itemsize)
    enc = P.planes_encode(data, itemsize, block=block)
    out = np.full(data.size + 8, 0xA5, np.uint8)[8:]  # aligned to 8 (numpy's 16, plus 8)
    assert _into()(enc, out) == (0 if _taken(enc) else 1)
    if _taken(enc):
        assert out.tobytes() == data.tobytes() == _steps(enc, data.size).tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("n", [1, 1000, (1 << 17) + 3, 3 << 17])
def test_store_layouts_are_taken(dtype, n):
    """Raw and Huffman planes of weights (the store's chunks): decoded in the one call, one
    block or several, the same bytes as the steps."""
    data = _values(7, n, dtype, 0)
    enc = P.planes_encode(data, np.dtype(dtype).itemsize)
    assert _taken(enc)
    out = np.empty(data.size, np.uint8)
    assert _into()(enc, out) == 0
    assert out.tobytes() == data.tobytes() == _steps(enc, data.size).tobytes()
    assert P.planes_decode(enc).tobytes() == data.tobytes()


def test_others_are_left_to_the_steps():
    """zstd planes, one-byte items, an out of another size, misaligned or overlapping."""
    x = np.zeros(70_000, np.float32)
    x[::7] = 1.5  # long runs of zeros: zstd planes
    zst = P.planes_encode(x, 4)
    assert not _taken(zst)
    w = _values(3, 20_000, np.float32, 0)
    enc = P.planes_encode(w, 4)
    into = _into()
    assert into(P.planes_encode(w, 1), np.empty(w.size, np.uint8)) == 1
    assert into(enc, np.empty(w.size - 4, np.uint8)) == 1
    assert into(enc, np.empty(w.size + 1, np.uint8)[1:]) == 1  # not aligned to the items
    both = np.concatenate([enc, np.zeros(w.size, np.uint8)])
    assert into(both[:enc.size], both[enc.size - 8:enc.size - 8 + w.size]) == 1
    out = np.empty(w.size, np.uint8)
    assert into(enc, out, out[:1024]) == 1  # a scratch inside out
    assert into(enc, out, np.empty(1000, np.uint8)) == 4 * 20_000  # a block of each plane
    assert into(enc, out, np.empty(4 * 20_000, np.uint8)) == 0
    assert out.tobytes() == w.tobytes()
    assert into(zst, np.empty(x.nbytes, np.uint8)) == 1
    assert P.planes_decode(zst).tobytes() == x.view(np.uint8).tobytes()


@settings(max_examples=80, deadline=None)
@given(dtype=DTYPES, n=st.integers(1, 20000), block=BLOCKS, seed=SEEDS,
       flips=st.integers(0, 4), cut=st.integers(0, 40), junk=st.booleans())
def test_corrupt_payloads(dtype, n, block, seed, flips, cut, junk):
    """Flipped, truncated or random payloads: decoded as the steps decode them, or left to the
    steps, which raise CodecError; never a crash."""
    rng = np.random.default_rng(seed)
    itemsize = np.dtype(dtype).itemsize
    data = _values(seed, n, dtype, 0)
    enc = P.planes_encode(data, itemsize, block=block).copy()
    if junk:
        enc[P._HEAD.size:] = rng.integers(0, 256, enc.size - P._HEAD.size, np.uint8)
    for k in rng.integers(0, enc.size, flips):
        enc[k] ^= rng.integers(1, 256)
    enc = enc[:max(0, enc.size - cut)].copy()
    out = np.empty(data.size, np.uint8)
    status = _into()(enc, out)
    assert status in (0, 1)
    try:
        want = _steps(enc, data.size)
    except CodecError:
        assert status == 1
        with pytest.raises(CodecError):
            P.planes_decode(enc, np.empty(data.size, np.uint8))
        return
    if status == 0:
        assert out.tobytes() == want.tobytes()
    assert P.planes_decode(enc, np.empty(data.size, np.uint8)).tobytes() == want.tobytes()
