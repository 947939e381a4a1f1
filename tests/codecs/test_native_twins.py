"""The compiled kernels write the same bytes as their numba twins (issue 28).

Each C kernel and its numba reference run on the same inputs -- sizes from empty to large,
every itemsize, rotation on and off, every bit width, blocks of rows and columns, codes with
bits above their width, each CPU path of the byte transposes -- into identical output buffers, compared byte for byte (what a kernel
leaves alone counts too). The references are reached through ``ckptcodecs._backend``, whatever
implementation this process runs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptcodecs import _backend

pytestmark = pytest.mark.skipif(_backend.native() is None,
                                reason="ckptcodecs' compiled kernels are not built")

FAMILIES = ("bytegroup", "bitpack", "delta", "rle_huffman")  # rle_huffman: its own file
SIZES = st.one_of(st.integers(0, 40), st.integers(0, 5000),
                  st.sampled_from([1 << 16, (1 << 17) + 3]))
UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


@pytest.fixture(params=_backend.native().simd_paths() if _backend.native() else ["portable"])
def simd(request):
    """Each CPU path of the byte transposes this machine runs, in turn (restored after)."""
    before = _backend.native().simd()
    _backend.use_simd(request.param)
    yield request.param
    _backend.use_simd(before)


#: a fixture that sets the CPU path once for all of a test's examples
ONCE = [HealthCheck.function_scoped_fixture]


def _twins(family: str):
    return _backend.implementation(family, "c"), _backend.implementation(family, "numba")


def _bytes(seed: int, n: int, runs: bool) -> np.ndarray:
    """``n`` random bytes, or bytes in runs of a few values (what sampling's repeats count)."""
    rng = np.random.default_rng(seed)
    if not runs:
        return rng.integers(0, 256, n, dtype=np.uint8)
    return np.repeat(rng.integers(0, 4, n, dtype=np.uint8), rng.integers(1, 9, n))[:n].copy()


def _same(c_out: np.ndarray, numba_out: np.ndarray) -> None:
    assert c_out.tobytes() == numba_out.tobytes()


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_has_both_implementations(family):
    c, ref = _twins(family)
    assert sorted(vars(c)) == sorted(vars(ref)) and vars(c)
    assert all(type(f).__name__ == "builtin_function_or_method" for f in vars(c).values())


@settings(max_examples=100, deadline=None, suppress_health_check=ONCE)
@given(n=SIZES, itemsize=st.sampled_from([1, 2, 4, 8]), rotate=st.booleans(),
       base=st.integers(0, 9), gap=st.integers(0, 9), seed=st.integers(0, 2**32 - 1),
       runs=st.booleans())
def test_split_rows(simd, n, itemsize, rotate, base, gap, seed, runs):
    c, ref = _twins("bytegroup")
    src = _bytes(seed, n * itemsize, runs)
    stride = n + gap
    out_c = _bytes(seed + 1, base + itemsize * stride + 3, False)
    out_ref = out_c.copy()
    c.split_rows(src, itemsize, rotate, out_c, base, stride)
    ref.split_rows(src, itemsize, rotate, out_ref, base, stride)
    _same(out_c, out_ref)


@settings(max_examples=120, deadline=None)
@given(n=SIZES, itemsize=st.sampled_from([1, 2, 4, 8]), step=st.integers(1, 700),
       where=st.floats(0, 1), part=st.floats(0, 1), seed=st.integers(0, 2**32 - 1),
       runs=st.booleans())
def test_sample_rows(n, itemsize, step, where, part, seed, runs):
    c, ref = _twins("bytegroup")
    stride, base = n + 5, 11
    out = _bytes(seed, base + itemsize * stride, runs)
    length = int(part * n)
    start = int(where * (n - length))
    rng = np.random.default_rng(seed)
    freq = rng.integers(0, 99, (itemsize, 256))  # the kernels add to what is there
    near = rng.integers(0, 99, (itemsize, 256))
    results = []
    for kernel in (c, ref):
        f, m, r = freq.copy(), near.copy(), np.full(itemsize, -1, np.int64)
        count = kernel.sample_rows(out, base, stride, n, itemsize, step, start, length, f, m, r)
        results.append((count, f.tobytes(), m.tobytes(), r.tobytes()))
    assert results[0] == results[1]


@st.composite
def blocks(draw):
    """A block of rows and columns of an array, the pitch of its runs in the destination."""
    nrows, ncols, depth = draw(st.integers(0, 40)), draw(st.integers(1, 40)), draw(
        st.integers(1, 3))
    r0 = draw(st.integers(0, nrows))
    r1 = draw(st.integers(r0, nrows))
    c0 = draw(st.integers(0, ncols))
    c1 = draw(st.integers(c0, ncols))
    length = (c1 - c0) * depth
    pitch = length + draw(st.integers(0, 5))
    return nrows * ncols * depth, (r0 * ncols + c0) * depth, ncols * depth, r1 - r0, length, pitch


@settings(max_examples=120, deadline=None, suppress_health_check=ONCE)
@given(itemsize=st.sampled_from([2, 4, 8]), rotate=st.booleans(), block=st.one_of(
    blocks(), SIZES.map(lambda n: (n, 0, n, 1, n, n))), seed=st.integers(0, 2**32 - 1))
def test_merge(simd, itemsize, rotate, block, seed):
    c, ref = _twins("bytegroup")
    n, src, src_pitch, rows, length, pitch = block
    planes = [_bytes(seed + p, n, False) for p in range(itemsize)]
    dst_c = _bytes(seed, (rows * pitch + 1) * itemsize, False).view(UINT[itemsize])
    dst_ref = dst_c.copy()
    name = f"merge{itemsize}"
    getattr(c, name)(*planes, rotate, dst_c, rows, length, pitch, src, src_pitch)
    getattr(ref, name)(*planes, rotate, dst_ref, rows, length, pitch, src, src_pitch)
    _same(dst_c, dst_ref)


@settings(max_examples=150, deadline=None)
@given(n=SIZES, bits=st.integers(1, 8), wide=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_pack_and_unpack(n, bits, wide, seed):
    """Codes within their width, and codes with higher bits set (packed as the reference does:
    not masked)."""
    c, ref = _twins("bitpack")
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 256 if wide else 1 << bits, n, dtype=np.uint8)
    size = (n * bits + 7) // 8
    packed_c, packed_ref = np.zeros((2, size + 2), np.uint8)
    c.pack(codes, bits, packed_c)
    ref.pack(codes, bits, packed_ref)
    _same(packed_c, packed_ref)
    stream = rng.integers(0, 256, size, dtype=np.uint8)  # any bytes unpack
    codes_c, codes_ref = np.zeros((2, n + 1), np.uint8)
    c.unpack(stream, bits, n, codes_c)
    ref.unpack(stream, bits, n, codes_ref)
    _same(codes_c, codes_ref)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_pack_in_place_as_the_reference(bits):
    """Codes packed into their own buffer, one of them above its width: the reference's bytes
    (the fast path at 2 and 4 bits, which writes before it knows every code fits, is for
    buffers apart)."""
    c, ref = _twins("bitpack")
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 1 << bits, 1000, dtype=np.uint8)
    codes[500] = 200
    got, want = codes.copy(), codes.copy()
    c.pack(got, bits, got)
    ref.pack(want, bits, want)
    _same(got, want)


@pytest.mark.parametrize("bits", [1, 3, 4])
def test_unpack_refuses_its_own_bytes(bits):
    """Codes unpacked over their own packed bytes: a ValueError, where the reference's codes
    depend on its loop (the only caller, bitpack.unpack_bits, unpacks into a new array)."""
    c, _ = _twins("bitpack")
    stream = np.random.default_rng(bits).integers(0, 256, 1001, dtype=np.uint8)
    kept = stream.copy()
    with pytest.raises(ValueError, match="share memory"):
        c.unpack(stream, bits, 1001, stream)
    with pytest.raises(ValueError, match="share memory"):
        c.unpack(stream[:500], bits, 600, stream[400:])
    _same(stream, kept)


@settings(max_examples=150, deadline=None)
@given(n=SIZES, k=st.one_of(st.integers(1, 256), st.sampled_from([1, 2, 255, 256])),
       seed=st.integers(0, 2**32 - 1))
def test_delta_encode_and_decode(n, k, seed):
    """Any bytes as new codes and residuals (the reference wraps values >= k once)."""
    c, ref = _twins("delta")
    rng = np.random.default_rng(seed)
    base = rng.integers(0, k, n, dtype=np.uint8)
    new = rng.integers(0, 256, n, dtype=np.uint8)
    for step in ("encode", "decode"):
        out_c, out_ref = np.zeros((2, n), np.uint8)
        getattr(c, step)(new, base, k, out_c)
        getattr(ref, step)(new, base, k, out_ref)
        _same(out_c, out_ref)
