"""BytePlanes' compiled Huffman coder against its numba twin, and on hostile input (issue 28).

The C kernels of the ``planes`` family (block histograms, code lengths, the encoder, the
decoder, the choice of each plane's coding and the layout of the planes) run on the same inputs
as the numba ones -- empty to > 64 KiB, one symbol, few (pairs), many, flat, skewed, lengths at
the 12-bit limit -- and write the same bytes into buffers filled alike beforehand, with the same
return values. The decoder also meets flipped, truncated and random payloads: the same status
and the same plane as numba's, never a crash. Arguments that do not fit their buffers raise
ValueError.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptcodecs import _backend
from ckptcodecs import _pkernels as PK
from ckptcodecs import planes as P
from ckptcodecs._bytegroup import split_rows

pytestmark = pytest.mark.skipif(_backend.native() is None,
                                reason="ckptcodecs' compiled kernels are not built")

SIZES = st.one_of(st.integers(0, 40), st.integers(1, 5000),
                  st.sampled_from([1 << 16, (1 << 16) + 3, (1 << 17) + 5]))
BLOCKS = st.sampled_from([64, 1024, 4099, 1 << 17])
KINDS = ["flat", "skewed", "one", "two", "few", "exponent", "fibonacci"]
SEEDS = st.integers(0, 2**32 - 1)


def _twins():
    return _backend.implementation("planes", "c"), _backend.implementation("planes", "numba")


def _data(seed: int, n: int, kind: str) -> np.ndarray:
    """``n`` bytes of one kind: flat, skewed, one or two values, at most 64 values (pairs),
    float32 exponent bytes, or Fibonacci-like frequencies (codes past the 12-bit limit)."""
    rng = np.random.default_rng(seed)
    if kind == "flat":
        return rng.integers(0, 256, n, dtype=np.uint8)
    if kind == "skewed":
        return np.minimum(rng.geometric(0.3, n) - 1, 255).astype(np.uint8)
    if kind == "one":
        return np.full(n, rng.integers(0, 256), np.uint8)
    if kind == "two":
        return rng.choice(rng.integers(0, 256, 2).astype(np.uint8), n, p=[0.9, 0.1])
    if kind == "few":
        return rng.choice(rng.integers(0, 256, 64).astype(np.uint8), n)
    if kind == "exponent":
        x = rng.standard_normal(n).astype(np.float32) * 0.02
        return ((x.view(np.uint32) >> 23) & 0xFF).astype(np.uint8)
    fib = np.array([1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 1597],
                   np.float64)
    return rng.choice(np.arange(17, dtype=np.uint8) * 7, n, p=fib / fib.sum())


def _stats(kernels, data: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray, int]:
    nblocks = (data.size + block - 1) // block
    freq = np.full((nblocks, 256), -7, np.int64)
    lens = np.full((nblocks, 256), -7, np.int64)
    kernels.plane_stats(data, block, freq)
    return freq, lens, kernels.huffman_lengths(freq, lens)


def _encoded(data: np.ndarray, block: int) -> np.ndarray:
    nb = _twins()[1]
    freq, _, _ = _stats(nb, data, block)
    out = np.zeros(nb.huffman_bound(data.size, block), np.uint8)
    return out[:nb.huffman_encode(data, block, freq, out)].copy()


@settings(max_examples=60, deadline=None)
@given(n=SIZES, kind=st.sampled_from(KINDS), block=BLOCKS, seed=SEEDS)
def test_stats_and_lengths(n, kind, block, seed):
    data = _data(seed, n, kind)
    (fc, lc, sc), (fn, ln, sn) = (_stats(k, data, block) for k in _twins())
    assert sc == sn and (fc == fn).all() and (lc == ln).all()
    c, nb = _twins()
    assert c.huffman_size(data, block) == nb.huffman_size(data, block) == sc
    assert c.huffman_bound(n, block) == nb.huffman_bound(n, block)
    if fc.shape[0]:
        lens_c, lens_n = np.full(256, 9, np.int64), np.full(256, 9, np.int64)
        c.code_lengths(fc[0], lens_c)
        nb.code_lengths(fc[0], lens_n)
        assert (lens_c == lens_n).all()


@settings(max_examples=60, deadline=None)
@given(n=SIZES, kind=st.sampled_from(KINDS), block=BLOCKS, seed=SEEDS)
def test_encode(n, kind, block, seed):
    data = _data(seed, n, kind)
    c, nb = _twins()
    freq, lens, bound = _stats(nb, data, block)
    fill = np.random.default_rng(seed).integers(0, 256, nb.huffman_bound(n, block), np.uint8)
    outs = [fill.copy() for _ in range(4)]
    sizes = [c.huffman_encode(data, block, freq, outs[0]),
             nb.huffman_encode(data, block, freq, outs[1]),
             c.huffman_encode_lengths(data, block, lens, outs[2][:bound + 8]),
             nb.huffman_encode_lengths(data, block, lens, outs[3][:bound + 8])]
    assert len(set(sizes)) == 1 and sizes[0] <= bound
    assert outs[0].tobytes() == outs[1].tobytes() and outs[2].tobytes() == outs[3].tobytes()


#: the plane size from which the C encoder runs its prefetching loop (CK_FAR in native.h)
FAR = 4 << 20


@pytest.mark.parametrize("kind", ["exponent", "skewed"])
@pytest.mark.parametrize("n", [FAR - 1, FAR + 4099])
def test_encode_either_side_of_the_prefetching_loop(kind, n):
    """Planes just below and above CK_FAR (pair-coded and byte-coded, a block and its streams
    not a multiple of a line): the numba kernel's bytes; an output a byte short of the code
    refused."""
    data = _data(n, n, kind)
    c, nb = _twins()
    freq, lens, bound = _stats(nb, data, 1 << 17)
    outs = [np.zeros(nb.huffman_bound(n, 1 << 17), np.uint8) for _ in range(2)]
    sizes = [k.huffman_encode(data, 1 << 17, freq, o) for k, o in zip((c, nb), outs)]
    assert sizes[0] == sizes[1] and outs[0].tobytes() == outs[1].tobytes()
    with pytest.raises(ValueError, match="too small"):
        c.huffman_encode_lengths(data, 1 << 17, lens, outs[0][:sizes[0] - 1])

def _decode_both(payload: np.ndarray, block: int, n: int, seed: int) -> np.ndarray:
    c, nb = _twins()
    fill = np.random.default_rng(seed).integers(0, 256, n, np.uint8)
    a, b = fill.copy(), fill.copy()
    used = c.huffman_decode(payload, block, a)
    assert used == nb.huffman_decode(payload, block, b)
    assert a.tobytes() == b.tobytes()
    return used, a


@settings(max_examples=60, deadline=None)
@given(n=SIZES, kind=st.sampled_from(KINDS), block=BLOCKS, seed=SEEDS)
def test_decode(n, kind, block, seed):
    data = _data(seed, n, kind)
    enc = _encoded(data, block)
    used, plane = _decode_both(enc, block, n, seed)
    assert used == enc.size and plane.tobytes() == data.tobytes()


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 20000), kind=st.sampled_from(KINDS), block=BLOCKS, seed=SEEDS,
       flips=st.integers(0, 4), cut=st.integers(0, 40), junk=st.booleans())
def test_decode_corrupt(n, kind, block, seed, flips, cut, junk):
    """Flipped, truncated or random payloads: numba's status and plane, in bounds."""
    rng = np.random.default_rng(seed)
    enc = _encoded(_data(seed, n, kind), block)
    if junk:
        enc = rng.integers(0, 256, enc.size, np.uint8)
    for k in rng.integers(0, max(enc.size, 1), flips):
        if enc.size:
            enc[k] ^= rng.integers(1, 256)
    _decode_both(enc[:max(0, enc.size - cut)].copy(), block, n, seed)


@settings(max_examples=60, deadline=None)
@given(planes=st.integers(1, 8), count=st.integers(1, 5000), length=st.integers(2, 5000),
       below=st.floats(0.0, 1.0), extra=st.floats(-0.1, 0.1), seed=SEEDS)
def test_choose_methods(planes, count, length, below, extra, seed):
    rng = np.random.default_rng(seed)
    freq = rng.integers(0, 3, (planes, 256)) * rng.integers(0, 50, (planes, 256))
    near = rng.integers(0, 2, (planes, 256)) * rng.integers(0, 50, (planes, 256))
    repeats = rng.integers(0, length, planes)
    c, nb = _twins()
    methods = [np.full(planes, 9, np.int64) for _ in range(2)]
    trials = [k.choose_methods(freq, near, repeats, count, length, below, extra, m)
              for k, m in zip((c, nb), methods)]
    assert trials[0] == trials[1] and (methods[0] == methods[1]).all()


@settings(max_examples=40, deadline=None)
@given(n=SIZES, itemsize=st.sampled_from([1, 2, 4, 8]), block=BLOCKS, seed=SEEDS,
       kinds=st.lists(st.sampled_from(KINDS), min_size=8, max_size=8),
       methods=st.lists(st.sampled_from([PK.RAW, PK.HUFFMAN, PK.ZSTD]), min_size=8,
                        max_size=8))
def test_pack_planes(n, itemsize, block, seed, kinds, methods):
    """The layout of planes of every kind, each raw, Huffman or zstd (a stand-in payload)."""
    src = np.stack([_data(seed + p, n, kinds[p]) for p in range(itemsize)], axis=1)
    stride, base = 9 + n, P._HEAD.size + 9
    out = np.zeros(P._HEAD.size + itemsize * stride, np.uint8)
    split_rows(src.reshape(-1), itemsize, False, out, base, stride)
    rng = np.random.default_rng(seed)
    sizes = [int(rng.integers(0, n)) if n and m == PK.ZSTD else 0 for m in methods[:itemsize]]
    zoff = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    zbuf = rng.integers(0, 256, zoff[-1], np.uint8)
    results = []
    for kernels in _twins():
        o, m = out.copy(), np.array(methods[:itemsize], np.int64)
        end = kernels.pack_planes(o, base, n, itemsize, block, m, zbuf, zoff)
        results.append((end, o.tobytes(), m.tolist()))
    assert results[0] == results[1]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.uint16, np.float64])
def test_codec_round_trip_is_numba_bytes(dtype):
    """A whole BytePlanes encode (C by default) decodes under numba's decoder and back."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(70_000) * 0.05).astype(dtype)
    enc = P.planes_encode(x, x.dtype.itemsize)
    assert P.planes_decode(enc).tobytes() == x.tobytes()


def _call(case: str):
    c = _twins()[0]
    data = _data(1, 5000, "skewed")
    enc = _encoded(data, 1024)
    freq, lens, bound = _stats(c, data, 1024)
    bad_lens = lens.copy()
    bad_lens[0, 3] = 13
    calls = {
        "stats freq short": lambda: c.plane_stats(data, 1024, np.zeros((2, 256), np.int64)),
        "stats block 0": lambda: c.plane_stats(data, 0, freq),
        "stats freq float32": lambda: c.plane_stats(data, 1024, freq.astype(np.float32)),
        "lengths rows": lambda: c.huffman_lengths(freq, np.zeros((2, 256), np.int64)),
        "lengths ragged": lambda: c.huffman_lengths(np.zeros(300, np.int64), lens),
        "lengths overlap": lambda: c.huffman_lengths(freq, freq),
        "encode out short": lambda: c.huffman_encode(data, 1024, freq, np.zeros(100, np.uint8)),
        "encode freq short": lambda: c.huffman_encode(data, 1024, freq[:2],
                                                      np.zeros(bound + 8, np.uint8)),
        "encode bad lens": lambda: c.huffman_encode_lengths(data, 1024, bad_lens,
                                                            np.zeros(bound + 8, np.uint8)),
        "encode overlap": lambda: c.huffman_encode(data, 1024, freq, data),
        "encode read-only out": lambda: c.huffman_encode(data, 1024, freq, enc),
        "bound negative": lambda: c.huffman_bound(-1, 1024),
        "decode block 0": lambda: c.huffman_decode(enc, 0, np.zeros(5000, np.uint8)),
        "decode overlap": lambda: c.huffman_decode(enc, 1024, enc),
        "decode int32 plane": lambda: c.huffman_decode(enc, 1024, np.zeros(5000, np.int32)),
        "choose count 0": lambda: c.choose_methods(freq[:2], freq[:2], np.zeros(2, np.int64),
                                                   0, 10, 0.9, 0.01, np.zeros(2, np.int64)),
        "choose methods short": lambda: c.choose_methods(freq[:2], freq[:2],
                                                         np.zeros(2, np.int64), 10, 10, 0.9,
                                                         0.01, np.zeros(1, np.int64)),
        "pack rows outside": lambda: c.pack_planes(np.zeros(100, np.uint8), 9, 50, 4, 1024,
                                                   np.zeros(4, np.int64), np.zeros(0, np.uint8),
                                                   np.zeros(5, np.int64)),
        "pack base": lambda: c.pack_planes(np.zeros(100, np.uint8), 3, 5, 1, 1024,
                                           np.zeros(1, np.int64), np.zeros(0, np.uint8),
                                           np.zeros(2, np.int64)),
        # planes of 0 bytes still get their 9-byte heads, which had no bounds check (ASan)
        "pack empty planes outside": lambda: c.pack_planes(
            np.zeros(64, np.uint8), 256, 0, 63, 176, np.zeros(63, np.int64),
            np.zeros(1, np.uint8), np.zeros(64, np.int64)),
        # counts no plane can have overflowed the size sums (signed: UBSan)
        "lengths counts too large": lambda: c.huffman_lengths(np.full((1, 256), 2**62, np.int64),
                                                              np.zeros((1, 256), np.int64)),
        "encode counts too large": lambda: c.huffman_encode(data, 1024,
                                                            np.full_like(freq, 2**62),
                                                            np.zeros(bound + 8, np.uint8)),
        "pack zstd offsets": lambda: c.pack_planes(np.zeros(100, np.uint8), 9, 20, 2, 1024,
                                                   np.full(2, PK.ZSTD, np.int64),
                                                   np.zeros(10, np.uint8),
                                                   np.array([0, 5, 50], np.int64)),
    }
    return calls[case]


@pytest.mark.parametrize("case", [
    "stats freq short", "stats block 0", "stats freq float32", "lengths rows", "lengths ragged",
    "lengths overlap", "encode out short", "encode freq short", "encode bad lens",
    "encode overlap", "bound negative", "decode block 0", "decode overlap",
    "decode int32 plane", "choose count 0", "choose methods short", "pack rows outside",
    "pack base", "pack zstd offsets", "pack empty planes outside", "lengths counts too large",
    "encode counts too large"])
def test_hostile_arguments_raise_value_error(case):
    with pytest.raises(ValueError):
        _call(case)()


def test_read_only_output_is_refused():
    with pytest.raises((ValueError, BufferError, TypeError)):
        _call("encode read-only out")()


def test_encode_into_a_tight_buffer_refuses_rather_than_overruns():
    """An out that holds the code but not numba's 8-byte slack: an error, the bytes past it
    untouched."""
    c = _twins()[0]
    data = _data(3, 20000, "skewed")
    freq, lens, bound = _stats(c, data, 4096)
    out = np.zeros(bound + 8, np.uint8)
    size = c.huffman_encode_lengths(data, 4096, lens, out)
    guard = np.full(size + 64, 0xAB, np.uint8)
    with pytest.raises(ValueError):
        c.huffman_encode_lengths(data, 4096, lens, guard[:size])
    assert (guard[size:] == 0xAB).all()


@pytest.mark.parametrize("path", _backend.native().simd_paths() if _backend.native() else [])
def test_every_cpu_path(path):
    """The baseline and the BMI2 builds of the stream loops (avx2 picks BMI2 where the CPU has
    it) write the same bytes as numba."""
    before = _backend.native().simd()
    _backend.use_simd(path)
    try:
        for k, kind in enumerate(KINDS):
            data = _data(k, 70_001, kind)
            c, nb = _twins()
            freq, _, _ = _stats(nb, data, 4099)
            outs = [np.zeros(nb.huffman_bound(data.size, 4099), np.uint8) for _ in range(2)]
            sizes = [t.huffman_encode(data, 4099, freq, o) for t, o in zip((c, nb), outs)]
            assert sizes[0] == sizes[1] and outs[0].tobytes() == outs[1].tobytes()
            used, plane = _decode_both(outs[0][:sizes[0]], 4099, data.size, k)
            assert used == sizes[0] and plane.tobytes() == data.tobytes()
    finally:
        _backend.use_simd(before)
