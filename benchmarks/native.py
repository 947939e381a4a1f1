"""The compiled kernels against their numba twins, side by side in one run (issue 28).

Usage::

    python benchmarks/native.py                  # both tables, markdown on stdout
    python benchmarks/native.py --mb 32 --repeat 7 --cold 3

1. Each ported kernel family (byte grouping, bit packing, BucketDelta) on the same inputs under
   C, on each CPU path this machine runs (``avx2``, ``sse2``, ``portable``: only the byte
   transposes differ), and numba, calls interleaved so that all see the same load: the median
   CPU time of this process (``time.process_time``: one thread, so the time of one core) after a
   warm-up call (numba's compile excluded), as GB/s of the kernel's input and numba / C (on the
   path ``auto`` picks).
   RLEHuffman's coder (``encode_stream``, ``decode_symbols``) on BucketDelta's residuals and on
   4-bit codes, with the compression ratio in the label. BytePlanes' Huffman coder
   (``plane_stats``, ``huffman_encode``, ``huffman_decode``) on the planes it codes: a float32's
   exponent byte, a float16's high byte, a plane of few symbols (coded two bytes a lookup).
   The adaptive range search (``histogram_search``, ``direct_ranges``) on float32 rows, and a
   whole adaptive ``quantize`` of 2048 x 4096 float32 values with either search.
2. RLEHuffman (BucketDelta's residuals) and BytePlanes (float32, bfloat16, float16) encode and
   decode as a whole: three processes per implementation, alternating, the median of their
   median CPU times.
3. The cold start: a fresh process whose first call is an RLEHuffman encode + decode of 10 MB
   of residuals, or a BytePlanes one of 10 MB of float32, numba's cache empty
   (``NUMBA_CACHE_DIR`` a new temporary folder) under each ``CKPTCODECS_KERNELS``; then the
   same with that cache filled. Wall time, median of ``--cold`` runs (under ``c`` nothing is
   compiled: BytePlanes' coder is C too).

The machine may be shared: the 1-minute load average is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

import ckptcodecs
from ckptcodecs import _backend, adaptive, rle_huffman

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import load_average, machine_description, markdown_table  # noqa: E402

IMPLEMENTATIONS = ("c", "numba")


def _median_cpu(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Median CPU seconds of each of ``fns``, called in turn ``repeat`` times after a warm-up."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.process_time()
            fn()
            times[name].append(time.process_time() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _bytegroup_cases(mb: int, rng) -> list[tuple[str, int, callable]]:
    """(label, input bytes, call(kernels)) of the byte grouping."""
    n4 = (mb << 20) // 4
    words = rng.standard_normal(n4).astype(np.float32).view(np.uint8)
    stride, base = n4 + 8, 16
    out = np.empty(base + 8 * (4 * n4 + 8), np.uint8)

    def split(itemsize, rotate):  # planes of 4 * n4 // itemsize bytes, 8 bytes apart
        return lambda k: k.split_rows(words, itemsize, rotate, out, base, 4 * n4 // itemsize + 8)

    planes4 = [out[base + p * stride:base + p * stride + n4] for p in range(4)]
    n2 = 2 * n4
    planes2 = [np.ascontiguousarray(words.view(np.uint16) >> (8 * p)).astype(np.uint8)
               for p in range(2)]
    dst4, dst2 = np.empty(n4, np.uint32), np.empty(n2, np.uint16)
    nrows, ncols = 4096, n4 // 4096
    r0, r1, c0, c1 = nrows // 4, 3 * nrows // 4, ncols // 4, 3 * ncols // 4
    block = np.empty((r1 - r0) * (c1 - c0), np.uint32)
    step = max(32, n4 // (1 << 14))
    step += (1, 0, 3, 2, 1, 0)[step % 6]

    def sample(k):
        freq, near = np.zeros((2, 4, 256), np.int64)
        k.sample_rows(out, base, stride, n4, 4, step, (n4 - (1 << 14)) // 2, 1 << 14, freq,
                      near, np.zeros(4, np.int64))

    return [
        ("split_rows, float32, rotated", 4 * n4, split(4, True)),
        ("split_rows, 16-bit, rotated", 4 * n4, split(2, True)),
        ("split_rows, 8-byte", 4 * n4, split(8, False)),
        ("merge4, whole array, rotated", 4 * n4,
         lambda k: k.merge4(*planes4, True, dst4, 1, n4, n4, 0, n4)),
        ("merge2, whole array, rotated", 2 * n2,
         lambda k: k.merge2(*planes2, True, dst2, 1, n2, n2, 0, n2)),
        ("merge4, block of 1/2 the rows and columns", 4 * block.size,
         lambda k: k.merge4(*planes4, True, block, r1 - r0, c1 - c0, c1 - c0, r0 * ncols + c0,
                            ncols)),
        ("sample_rows, float32 (the planes' samples)", 4 * n4, sample),
    ]


def _code_cases(mb: int, rng) -> list[tuple[str, str, int, callable]]:
    """(family, label, input bytes, call(kernels)) of bit packing and BucketDelta."""
    n = mb << 20
    cases = []
    for bits in (3, 4):
        codes = rng.integers(0, 1 << bits, n, dtype=np.uint8)
        packed = np.empty((n * bits + 7) // 8, np.uint8)
        out = np.empty(n, np.uint8)
        cases += [("bitpack", f"pack, {bits} bits", n,
                   lambda k, c=codes, p=packed, b=bits: k.pack(c, b, p)),
                  ("bitpack", f"unpack, {bits} bits", n,
                   lambda k, p=packed, o=out, b=bits: k.unpack(p, b, n, o))]
    base = rng.integers(0, 16, n, dtype=np.uint8)
    new = np.where(rng.random(n) < 0.1, rng.integers(0, 16, n, dtype=np.uint8), base)
    res, dec = np.empty(n, np.uint8), np.empty(n, np.uint8)
    cases += [("delta", "encode, K=16, 10% changed", n, lambda k: k.encode(new, base, 16, res)),
              ("delta", "decode, K=16, 10% changed", n, lambda k: k.decode(res, base, 16, dec))]
    residuals = np.empty(n, np.uint8)  # what RLEHuffman codes in a store
    _backend.implementation("delta", "numba").encode(new, base, 16, residuals)
    return cases + _rle_huffman_cases(residuals, rng) + _planes_cases(mb, rng)


def _rle_huffman_cases(residuals: np.ndarray, rng) -> list[tuple[str, str, int, callable]]:
    """(family, label, input bytes, call(kernels)) of RLEHuffman's coder: BucketDelta's
    residuals (what it codes in a store) and 4- and 8-bit codes of a bell curve (a quantized
    chunk's codes, one a byte); the label gives the
    compression ratio (the same bytes under both)."""
    n = residuals.size
    bell = np.clip(np.rint(rng.standard_normal(n) * 2 + 8), 0, 15).astype(np.uint8)
    bell8 = np.clip(np.rint(rng.standard_normal(n) * 40 + 128), 0, 255).astype(np.uint8)
    cases = []
    for name, data in (("residuals, K=16, 10% changed", residuals), ("4-bit codes, bell", bell),
                       ("8-bit codes, bell", bell8)):
        payload = rle_huffman.rle_huffman_encode(data)
        stream, nsym, size, tables = rle_huffman.coded_parts(payload)
        ratio = n / len(payload)
        out = np.empty(n, np.uint8)
        cases += [("rle_huffman", f"encode_stream, {name} ({ratio:.1f}×)", n,
                   lambda k, d=data: k.encode_stream(d, 22)),
                  ("rle_huffman", f"decode_symbols, {name}", n,
                   lambda k, a=(stream, nsym, size, *tables), o=out: k.decode_symbols(*a, o))]
    return cases


def _quant_cases(mb: int, rng) -> list[tuple[str, str, int, callable]]:
    """(family, label, input bytes, call(kernels)) of Quantize's kernels on float32 rows of
    4096 values (4-bit codes: 15 levels and a protect code, 1% protected)."""
    n, seg = (mb << 20) // 4, 4096
    nseg = -(-n // seg)
    x = rng.standard_normal(n).astype(np.float32)
    mask = (rng.random(n) < 0.01).astype(np.uint8)
    lo, hi = np.empty(nseg, np.float32), np.empty(nseg, np.float32)
    zero = rng.standard_normal(nseg).astype(np.float32)
    inv = (rng.random(nseg) * 4 + 1).astype(np.float32)
    f32 = np.float32
    codes = np.where(mask == 1, 16, rng.integers(0, 15, n)).astype(np.uint8)
    prot = rng.standard_normal(int(mask.sum())).astype(np.float32)
    out, book = np.empty(n, np.float32), rng.standard_normal((nseg, 15))
    ucodes = np.empty(n, np.uint8)
    v = rng.standard_normal(n // 2) * 100  # float64: as many bytes as x
    vout, z, sc = np.empty_like(v), np.empty(nseg), np.empty(nseg)
    lo64, hi64 = np.sort(rng.standard_normal((2, nseg)), axis=0)
    return [
        ("quant", "seg_minmax, float32, rows of 4096", 4 * n,
         lambda k: k.seg_minmax(x, seg, np.zeros(0, np.uint8), lo, hi)),
        ("quant", "seg_minmax, float32, 1% masked", 4 * n,
         lambda k: k.seg_minmax(x, seg, mask, lo, hi)),
        ("quant", "seg_absmax, float32", 4 * n,
         lambda k: k.seg_absmax(x, seg, np.zeros(0, np.uint8), hi)),
        ("quant", "uniform_codes, float32, 4 bits", 4 * n,
         lambda k: k.uniform_codes(x, seg, zero, inv, f32(14), f32(0.5), f32(0), ucodes)),
        ("quant", "dequant_uniform, 4-bit codes, 1% protected", n,
         lambda k: k.dequant_uniform(codes, seg, zero, inv, 15, 15, 16, prot, 3.4e38, out)),
        ("quant", "dequant_codebook, 4-bit codes, 1% protected", n,
         lambda k: k.dequant_codebook(codes, seg, book, 15, 15, 16, prot, out)),
        ("quant", "f16_round, float64, nearest", 8 * v.size, lambda k: k.f16_round(v, 0, vout)),
        ("quant", "uniform_params_f16, per row", 16 * nseg,
         lambda k: k.uniform_params_f16(lo64, hi64, 15, z, sc)),
    ]


def _select_cases(mb: int, rng) -> list[tuple[str, str, int, callable]]:
    """(family, label, input bytes, call(kernels)) of the protect/prune selection's two passes
    on float32 values (1% excluded or none), collecting around the median bucket."""
    x = rng.standard_normal((mb << 20) // 4).astype(np.float32)
    xb, shift, inf = x.view(np.uint32), np.uint32(16), np.uint32(0x7F800000)
    excl = (rng.random(x.size) < 0.01).astype(np.uint8)
    counts = np.zeros(1 << 15, np.int64)
    _backend.implementation("select", "numba").keys_hist(xb, excl, shift, inf, counts)
    b = int(np.searchsorted(np.cumsum(counts), x.size // 2))
    sure, cand = np.empty(int(counts[:b].sum()), np.int64), np.empty(int(counts[b]), np.int64)
    none = np.zeros(0, np.uint8)
    return [
        ("select", "keys_hist, float32", 4 * x.size,
         lambda k: k.keys_hist(xb, none, shift, inf, np.zeros(1 << 15, np.int64))),
        ("select", "keys_hist, float32, 1% excluded", 4 * x.size,
         lambda k: k.keys_hist(xb, excl, shift, inf, np.zeros(1 << 15, np.int64))),
        ("select", "collect, float32, 1% excluded, below the median", 4 * x.size,
         lambda k: k.collect(xb, excl, shift, inf, b, False, sure, cand)),
    ]


def _planes_cases(mb: int, rng) -> list[tuple[str, str, int, callable]]:
    """(family, label, input bytes, call(kernels)) of BytePlanes' Huffman coder on the planes it
    codes (blocks of 128 KiB, as the codec's), the compression ratio in the label."""
    n, block = mb << 20, 1 << 17
    weights = rng.standard_normal(n).astype(np.float32) * 0.02
    planes = {"float32 exponent byte": ((weights.view(np.uint32) >> 23) & 0xFF).astype(np.uint8),
              "float16 high byte": (weights.astype(np.float16).view(np.uint16) >> 8).astype(
                  np.uint8),
              "few symbols (pairs)": rng.choice(np.arange(0, 240, 6, dtype=np.uint8), n,
                                                p=np.arange(40, 0, -1) / 820)}
    ref, cases = _backend.implementation("planes", "numba"), []
    for name, plane in planes.items():
        freq = np.zeros(((n + block - 1) // block, 256), np.int64)
        ref.plane_stats(plane, block, freq)
        out = np.empty(ref.huffman_bound(n, block), np.uint8)
        coded = out[:ref.huffman_encode(plane, block, freq, out)].copy()
        back = np.empty(n, np.uint8)
        cases += [("planes", f"plane_stats, {name}", n,
                   lambda k, p=plane, f=freq: k.plane_stats(p, block, f)),
                  ("planes", f"huffman_encode, {name} ({n / coded.size:.2f}×)", n,
                   lambda k, p=plane, f=freq, o=out: k.huffman_encode(p, block, f, o)),
                  ("planes", f"huffman_decode, {name}", n,
                   lambda k, c=coded, b=back: k.huffman_decode(c, block, b))]
    return cases


def _float_cases(mb: int, rng) -> list[tuple[str, str, int, callable]]:
    """(family, label, input bytes, call(kernels)) of the 16-bit float casts on normal
    values, and of the residual sum of 16-bit values and small residuals."""
    n = (mb << 20) // 4
    x = rng.standard_normal(n).astype(np.float32)
    u, out16, out32 = x.view(np.uint32), np.empty(n, np.uint16), np.empty(n, np.uint32)
    halves = x.astype(np.float16).view(np.uint16)
    m = n // 2
    res = (x[m:2 * m] * np.float32(1e-3)).astype(np.float16).view(np.uint16)
    bres = (x[m:2 * m] * np.float32(1e-3)).view(np.uint32) >> np.uint32(16)
    bf16, bres = (u >> np.uint32(16)).astype(np.uint16)[:m], bres.astype(np.uint16)
    top16, topb = np.float32(65504.0), np.float32(3.3895313892515355e38)
    return [
        ("floats", "bf16_bits, float32 -> bfloat16", 4 * n, lambda k: k.bf16_bits(u, out16)),
        ("floats", "f16_bits, float32 -> float16", 4 * n, lambda k: k.f16_bits(u, out16)),
        ("floats", "f32_bits, float16 -> float32", 2 * n, lambda k: k.f32_bits(halves, out32)),
        ("floats", "add16, float16 + residual", 4 * m,
         lambda k: k.add16(halves[:m], res, True, top16, out16[:m])),
        ("floats", "add16, bfloat16 + residual", 4 * m,
         lambda k: k.add16(bf16, bres, False, topb, out16[:m])),
    ]


def _kmeans_cases(mb: int, rng) -> list[tuple[str, str, int, callable]]:
    """(family, label, input bytes, call(kernels)) of the k-means fits and code assignment on
    heavy-tailed float32 values (64 Ki-value segments)."""
    from ckptcodecs.kmeans import MANTISSA_BITS

    n, seg = (mb << 20) // 4, 1 << 16
    x = (rng.standard_t(3, n) * 0.05).astype(np.float32)
    bits, nseg, none = x.view(np.uint32), -(-n // seg), np.zeros(0, np.uint8)
    ordered = np.where(bits >> 31 == 1, ~bits, bits | np.uint32(1 << 31))
    keys = (np.arange(n) // seg << 16) | (ordered >> (23 - MANTISSA_BITS)).astype(np.int64)
    uniq, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    sums = np.zeros(uniq.size)
    np.add.at(sums, inverse, x.astype(np.float64))
    offsets = np.searchsorted(uniq >> 16, np.arange(nseg + 1))
    books = {k: np.empty((nseg, k)) for k in (4, 16, 256)}
    codes = np.empty(n, np.uint8)
    cases = []
    for k in (16, 256):
        cases += [("kmeans", f"fit_codebooks, {k} levels, lam 0.3", 4 * n,
                   lambda kk, k=k: kk.fit_codebooks(x, bits, seg, none, k, 0.3, 1, books[k])),
                  ("kmeans", f"fit_from_buckets, {k} levels ({counts.size} buckets)", 4 * n,
                   lambda kk, k=k: kk.fit_from_buckets(counts, sums, offsets, k, 0.3, 1,
                                                       books[k]))]
    for k in (4, 16, 256):
        _backend.implementation("kmeans", "numba").fit_codebooks(x, bits, seg, none, k, 1.0, 1,
                                                                 books[k])
        book = books[k].astype(np.float32)
        cases.append(("kmeans", f"nearest_codes, {k} levels", 4 * n,
                      lambda kk, b=book: kk.nearest_codes(x, seg, b, codes)))
    return cases


def _adaptive_cases(mb: int, rng) -> list[tuple[str, str, int, callable]]:
    """(family, label, input bytes, call(kernels)) of the adaptive range search (4 bits: 16
    levels, 45 bins; 2 bits: 4 levels, 25 bins) on float32 rows, each call from the rows'
    min/max (reset first), and a whole ``quantize(x, "adaptive-asymmetric", 4)`` of a 2048 x
    4096 float32 array with the search of either kernels."""
    x = rng.standard_normal((mb << 20) // 4).astype(np.float32)
    none = np.zeros(0, np.uint8)

    def case(seg: int, nq: int, nb: int, direct: bool, counts: bool = False):
        nseg = x.size // seg
        lo0, hi0 = np.empty(nseg, np.float32), np.empty(nseg, np.float32)
        _backend.implementation("quant", "c").seg_minmax(x, seg, none, lo0, hi0)
        lo0, hi0 = lo0.astype(np.float64), hi0.astype(np.float64)
        lo, hi = lo0.copy(), hi0.copy()
        cnt = np.zeros((0, 0), np.int64)
        if counts:
            h = nb * adaptive.HIST_PER_BIN
            cell = ((x[:nseg * seg].reshape(nseg, seg).astype(np.float64) - lo0[:, None])
                    * (h / (hi0 - lo0))[:, None]).astype(np.int64).clip(0, h - 1)
            cnt = np.stack([np.bincount(r, minlength=h) for r in cell]).astype(np.int64)

        def call(k):
            np.copyto(lo, lo0)
            np.copyto(hi, hi0)
            if direct:
                k.direct_ranges(x, seg, none, lo, hi, nq, nb, 1.0)
            elif counts:
                k.histogram_search(x[:0], 1, none, cnt, lo, hi, nq, nb, 1.0)
            else:
                k.histogram_search(x, seg, none, cnt, lo, hi, nq, nb, 1.0)
        return call

    whole = rng.standard_normal((2048, 4096)).astype(np.float32)

    def quantize_with(k):
        chosen = adaptive._ADAPTIVE
        adaptive._ADAPTIVE = k
        try:
            ckptcodecs.quantize(whole, "adaptive-asymmetric", 4)
        finally:
            adaptive._ADAPTIVE = chosen

    n = 4 * x.size
    return [
        ("adaptive", "histogram_search, rows of 4096, 4 bits", n, case(4096, 16, 45, False)),
        ("adaptive", "histogram_search, rows of 128, 4 bits", n, case(128, 16, 45, False)),
        ("adaptive", "histogram_search, rows of 64, 4 bits", n, case(64, 16, 45, False)),
        ("adaptive", "histogram_search, rows of 1024, 8 bits", n, case(1024, 256, 45, False)),
        ("adaptive", "histogram_search from counts, rows of 4096, 4 bits", n // 4096 * 180 * 8,
         case(4096, 16, 45, False, True)),
        ("adaptive", "direct_ranges, rows of 32, 4 bits", n, case(32, 16, 45, True)),
        ("adaptive", "direct_ranges, rows of 16, 2 bits", n, case(16, 4, 25, True)),
        ("adaptive", "quantize adaptive-asymmetric 4 bits, 2048 x 4096", 4 * whole.size,
         quantize_with),
    ]


def _variants(family: str, call: Callable) -> dict[str, Callable[[], object]]:
    """One call of the case per implementation: C on each CPU path this machine runs (the
    path set before each call), then numba."""
    native, c = _backend.native(), _backend.implementation(family, "c")
    ref = _backend.implementation(family, "numba")
    out = {f"C {path}": (lambda p=path: (native.set_simd(p), call(c)))
           for path in reversed(native.simd_paths())}
    out["numba"] = lambda: call(ref)
    return out


def kernels_table(mb: int, repeat: int, families: list[str] | None = None) -> str:
    """Each kernel on each C path and numba: GB/s of its input, and numba / C on the path
    ``auto`` picks (the first); only the kernels of ``families`` if given."""
    rng = np.random.default_rng(0)
    cases = [("bytegroup", *case) for case in _bytegroup_cases(mb, rng)] + _code_cases(mb, rng)
    cases += _quant_cases(mb, rng) + _select_cases(mb, rng) + _adaptive_cases(mb, rng)
    cases += _float_cases(mb, rng) + _kmeans_cases(mb, rng)
    if families:
        cases = [case for case in cases if case[0] in families]
    rows, names = [], []
    before = _backend.native().simd()
    try:
        for family, label, nbytes, call in cases:
            t = _median_cpu(_variants(family, call), repeat)
            names = list(t)
            auto = t[f"C {_backend.native().simd_paths()[-1]}"]  # what "auto" runs
            rows.append([family, label, f"{nbytes / 1e6:.0f}",
                         *(f"{nbytes / v / 1e9:.2f}" for v in t.values()),
                         f"{t['numba'] / auto:.2f}×"])
    finally:
        _backend.use_simd(before)
    header = ["family", "kernel", "MB in", *(f"{n} GB/s" for n in names), "numba / C auto"]
    return markdown_table(header, rows, "ll" + "r" * (len(header) - 2))


_CODEC = """
import json, statistics, sys, time
import numpy as np
import ckptcodecs
mb, repeat = int(sys.argv[1]), int(sys.argv[2])
x = np.random.default_rng(0).standard_normal((mb << 20) // 4).astype(np.float32)
inputs = {"float32": (x, 4), "bfloat16": ((x.view(np.uint32) >> 16).astype(np.uint16), 2),
          "float16": (x.astype(np.float16), 2)}
rng = np.random.default_rng(1)
base = rng.integers(0, 16, mb << 20, dtype=np.uint8)
new = np.where(rng.random(base.size) < 0.1, rng.integers(0, 16, base.size, dtype=np.uint8), base)
res = ckptcodecs.delta_encode(new, base, 16)
enc = ckptcodecs.rle_huffman_encode(res)
ckptcodecs.rle_huffman_decode(enc)
times = {"encode": [], "decode": []}
for _ in range(repeat):
    t0 = time.process_time()
    ckptcodecs.rle_huffman_encode(res)
    t1 = time.process_time()
    ckptcodecs.rle_huffman_decode(enc)
    times["encode"].append(t1 - t0)
    times["decode"].append(time.process_time() - t1)
out = {f"RLEHuffman residuals {step}": res.size / statistics.median(ts) / 1e9
       for step, ts in times.items()}
for name, (data, itemsize) in inputs.items():
    enc = ckptcodecs.planes_encode(data, itemsize)
    ckptcodecs.planes_decode(enc)
    times = {"encode": [], "decode": []}
    for _ in range(repeat):
        t0 = time.process_time()
        ckptcodecs.planes_encode(data, itemsize)
        t1 = time.process_time()
        ckptcodecs.planes_decode(enc)
        times["encode"].append(t1 - t0)
        times["decode"].append(time.process_time() - t1)
    for step, ts in times.items():
        out[f"{name} {step}"] = data.nbytes / statistics.median(ts) / 1e9
print(json.dumps(out))
"""


def codec_table(mb: int, repeat: int, rounds: int = 3) -> str:
    """RLEHuffman (BucketDelta's residuals) and BytePlanes (float32, bfloat16, float16) encode and
    decode, GB/s of the input: ``rounds`` processes per implementation, alternating, the
    median of their medians."""
    got: dict[str, dict[str, list[float]]] = {which: {} for which in IMPLEMENTATIONS}
    for _ in range(rounds):
        for which in IMPLEMENTATIONS:
            env = {**os.environ, "CKPTCODECS_KERNELS": which}
            run = subprocess.run([sys.executable, "-c", _CODEC, str(mb), str(repeat)], env=env,
                                 capture_output=True, text=True, check=True)
            for case, gbps in json.loads(run.stdout.strip().splitlines()[-1]).items():
                got[which].setdefault(case, []).append(gbps)
    med = {which: {case: statistics.median(v) for case, v in cases.items()}
           for which, cases in got.items()}
    rows = [[case, f"{med['c'][case]:.2f}", f"{med['numba'][case]:.2f}",
             f"{med['c'][case] / med['numba'][case]:.2f}×"] for case in med["c"]]
    return markdown_table(["codec as a whole", "C GB/s", "numba GB/s", "numba / C"], rows,
                          "lrrr")


_FIRST_CALL = """
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import ckptcodecs
t1 = time.perf_counter()
rng = np.random.default_rng(0)
if sys.argv[1] == "BytePlanes":
    data = rng.standard_normal(10 * 2**20 // 4).astype(np.float32)
    enc = ckptcodecs.planes_encode(data, 4)
    assert ckptcodecs.planes_decode(enc).tobytes() == data.tobytes()
else:  # RLEHuffman of 10 MB of 4-bit residuals, mostly zero
    data = np.where(rng.random(10 * 2**20) < 0.1, rng.integers(0, 16, 10 * 2**20), 0)
    enc = ckptcodecs.rle_huffman_encode(data.astype(np.uint8))
    assert ckptcodecs.rle_huffman_decode(enc).tobytes() == data.astype(np.uint8).tobytes()
t2 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "first": t2 - t1, "kernels": ckptcodecs._backend.CHOICE}))
"""


def _first_call(codec: str, which: str, cache: str) -> dict:
    env = {**os.environ, "CKPTCODECS_KERNELS": which, "NUMBA_CACHE_DIR": cache}
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, "-c", _FIRST_CALL, codec], env=env,
                         capture_output=True, text=True, check=True)
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["kernels"] == which
    return {**result, "process": time.perf_counter() - t0}


def cold_table(runs: int) -> str:
    """Wall seconds of a fresh process's import and first round trip of each codec."""
    got: dict[tuple[str, str, str], list[dict]] = {}
    for _ in range(runs):
        for codec in ("RLEHuffman", "BytePlanes"):
            for which in IMPLEMENTATIONS:  # interleaved, as the kernels are
                with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
                    for state in ("empty", "filled"):
                        got.setdefault((codec, which, state), []).append(
                            _first_call(codec, which, cache))
    rows = []
    for (codec, which, cache), results in got.items():
        med = {key: statistics.median(r[key] for r in results)
               for key in ("import", "first", "process")}
        rows.append([codec, which, cache, f"{med['import']:.2f}", f"{med['first']:.2f}",
                     f"{med['process']:.2f}", len(results)])
    rows.sort(key=lambda r: (r[0], r[2], r[1]))
    return markdown_table(["first codec", "kernels", "numba cache", "import s",
                           "first encode+decode s", "whole process s", "runs"], rows,
                          "lllrrrr")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=32, help="MiB of input a kernel call")
    parser.add_argument("--repeat", type=int, default=7, help="timed calls a kernel")
    parser.add_argument("--cold", type=int, default=3, help="fresh processes a row")
    parser.add_argument("--families", nargs="+", help="only these kernel families' rows "
                        "(and not the codec and cold-start tables)")
    args = parser.parse_args(argv)
    if _backend.native() is None:
        sys.exit("ckptcodecs' compiled kernels are not built: pip install -e .")
    print(f"{machine_description()}; load average {load_average()} at the start\n")
    print(kernels_table(args.mb, args.repeat, args.families) + "\n")
    if args.families:
        return
    print(f"load average {load_average()}\n")
    print(codec_table(args.mb, args.repeat) + "\n")
    print(f"load average {load_average()}\n")
    if args.cold:
        print(cold_table(args.cold) + "\n")
        print(f"load average {load_average()} at the end")


if __name__ == "__main__":
    main()
