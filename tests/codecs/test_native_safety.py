"""The compiled kernels on hostile arguments, and with the GIL released (issue 28).

Every size a kernel is given is checked against the buffers it reads and writes: a
``ValueError`` naming what does not fit, never a read or a write out of bounds. The kernels run
without the GIL: another Python thread makes progress while one runs.
"""

from __future__ import annotations

import numpy as np
import pytest

from ckptcodecs import _backend, rle_huffman
from helpers import progress_during

pytestmark = pytest.mark.skipif(_backend.native() is None,
                                reason="ckptcodecs' compiled kernels are not built")


def _c(family: str):
    return _backend.implementation(family, "c")


def _bytes(n: int) -> np.ndarray:
    return np.zeros(n, np.uint8)


def _read_only(n: int) -> np.ndarray:
    a = _bytes(n)
    a.flags.writeable = False
    return a


def _planes(k: int, n: int = 100) -> list[np.ndarray]:
    return [_bytes(n) for _ in range(k)]


def _sample(n=100, itemsize=2, step=1, start=0, length=10, freq=2, rep=2, out=300, base=0):
    return (_bytes(out), base, 100, n, itemsize, step, start, length,
            np.zeros((freq, 256), np.int64), np.zeros((2, 256), np.int64),
            np.zeros(rep, np.int64))


_SHARED = _bytes(64)  # one buffer as input and output

#: one buffer of codes below 16 that the delta overlap cases slice
_CODES = np.random.default_rng(7).integers(0, 16, 192, dtype=np.uint8)
HOSTILE = {
    "split_rows itemsize 3": ("bytegroup", "split_rows", (_bytes(9), 3, False, _bytes(99), 0, 3)),
    "split_rows part of an item": ("bytegroup", "split_rows",
                                   (_bytes(9), 2, False, _bytes(99), 0, 9)),
    "split_rows planes overlap": ("bytegroup", "split_rows",
                                  (_bytes(8), 2, False, _bytes(99), 0, 3)),
    "split_rows out too small": ("bytegroup", "split_rows",
                                 (_bytes(8), 4, True, _bytes(7), 0, 2)),
    "split_rows negative base": ("bytegroup", "split_rows",
                                 (_bytes(8), 4, True, _bytes(99), -1, 2)),
    "split_rows read-only out": ("bytegroup", "split_rows",
                                 (_bytes(8), 4, True, _read_only(99), 0, 2)),
    "split_rows out is src": ("bytegroup", "split_rows", (_SHARED, 4, True, _SHARED, 0, 2)),
    "merge dst is a plane": ("bytegroup", "merge2", (_SHARED, _bytes(8), False,
                                                     _SHARED.view(np.uint16), 1, 2, 2, 0, 2)),
    "merge runs past the planes": ("bytegroup", "merge2",
                                   (*_planes(2), False, np.zeros(100, np.uint16),
                                    2, 10, 10, 0, 91)),
    "merge runs past dst": ("bytegroup", "merge4",
                            (*_planes(4), True, np.zeros(19, np.uint32), 2, 10, 10, 0, 10)),
    "merge pitch overflows": ("bytegroup", "merge8",
                              (*_planes(8), False, np.zeros(10, np.uint64),
                               3, 1, 2**62, 0, 1)),
    "merge negative rows": ("bytegroup", "merge2",
                            (*_planes(2), False, np.zeros(10, np.uint16), -1, 1, 1, 0, 1)),
    "merge dst of other items": ("bytegroup", "merge4",
                                 (*_planes(4), False, np.zeros(10, np.uint16), 1, 1, 1, 0, 1)),
    "merge plane of other items": ("bytegroup", "merge2",
                                   (_bytes(9), np.zeros(9, np.uint16), False,
                                    np.zeros(9, np.uint16), 1, 1, 1, 0, 1)),
    "sample past the plane": ("bytegroup", "sample_rows", _sample(start=95, length=10)),
    "sample step 0": ("bytegroup", "sample_rows", _sample(step=0)),
    "sample freq too small": ("bytegroup", "sample_rows", _sample(itemsize=3, freq=2, rep=3)),
    "sample repeats too small": ("bytegroup", "sample_rows", _sample(rep=1)),
    "sample planes past out": ("bytegroup", "sample_rows", _sample(out=150, base=1)),
    "pack 0 bits": ("bitpack", "pack", (_bytes(8), 0, _bytes(8))),
    "pack 9 bits": ("bitpack", "pack", (_bytes(8), 9, _bytes(9))),
    "pack out too small": ("bitpack", "pack", (_bytes(9), 3, _bytes(3))),
    "unpack stream truncated": ("bitpack", "unpack", (_bytes(3), 3, 9, _bytes(9))),
    "unpack out too small": ("bitpack", "unpack", (_bytes(4), 3, 9, _bytes(8))),
    "unpack negative count": ("bitpack", "unpack", (_bytes(4), 3, -1, _bytes(8))),
    "delta k 0": ("delta", "encode", (_bytes(4), _bytes(4), 0, _bytes(4))),
    "delta k 257": ("delta", "decode", (_bytes(4), _bytes(4), 257, _bytes(4))),
    "delta base code >= k": ("delta", "decode",
                             (_bytes(4), np.array([0, 1, 5, 0], np.uint8), 5, _bytes(4))),
    "delta sizes differ": ("delta", "encode", (_bytes(5), _bytes(4), 4, _bytes(5))),
    "delta out too small": ("delta", "encode", (_bytes(4), _bytes(4), 4, _bytes(3))),
    # out sharing bytes with what the buckets are read from wrote past out's end (ASan)
    "delta out is base": ("delta", "encode", (_CODES[:64], _CODES[64:128], 16, _CODES[64:128])),
    "delta out overlaps base": ("delta", "decode", (_bytes(128), _CODES[1:129], 16,
                                                    _CODES[:128])),
    "delta out is the residuals": ("delta", "decode", (_CODES[:128], _bytes(128), 16,
                                                       _CODES[:128])),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_sizes_raise_value_error(case):
    family, name, args = HOSTILE[case]
    with pytest.raises(ValueError):
        getattr(_c(family), name)(*args)


def test_non_contiguous_buffer_is_refused():
    with pytest.raises(ValueError, match="contiguous"):
        _c("bitpack").pack(_bytes(16)[::2], 3, _bytes(8))


def _rle_huffman_args(data: np.ndarray) -> tuple:
    """decode_symbols' arguments but ``out`` for the RLEHuffman payload of ``data``."""
    stream, nsym, n, tables = rle_huffman.coded_parts(rle_huffman.rle_huffman_encode(data))
    return stream, nsym, n, *tables


def _big_calls():
    """One long call of each family (tens of ms), every buffer allocated beforehand (numpy
    may release the GIL while it allocates)."""
    n = 1 << 24
    src, planes, out, words = _bytes(4 * n), _planes(4, n), _bytes(4 * n), np.zeros(n, np.uint32)
    skewed = np.minimum(np.random.default_rng(0).geometric(0.3, n) - 1, 255).astype(np.uint8)
    rle_args = _rle_huffman_args(skewed)
    lo, hi = np.zeros(n // 64, np.float32), np.zeros(n // 64, np.float32)
    counts = np.zeros(1 << 15, np.int64)
    pk, block = _c("planes"), 1 << 17
    freq, coded = np.zeros((n // block, 256), np.int64), _bytes(pk.huffman_bound(n, block))
    pk.plane_stats(skewed, block, freq)
    stream = coded[:pk.huffman_encode(skewed, block, freq, coded)].copy()
    x = np.random.default_rng(0).standard_normal(1 << 22).astype(np.float32)
    book = np.sort(np.random.default_rng(1).standard_normal((64, 256)), axis=1)
    alo, ahi = np.full(n // 4096, -1.0), np.full(n // 4096, 1.0)  # refined, never to width 0
    return {
        "bytegroup": lambda: _c("bytegroup").merge4(*planes, True, words, 1, n, n, 0, n),
        "split_rows": lambda: _c("bytegroup").split_rows(src, 4, True, out, 0, n),
        "bitpack": lambda: _c("bitpack").unpack(src, 3, n, out),
        "delta": lambda: _c("delta").encode(src[:n], planes[0], 4, out[:n]),
        "rle_huffman encode": lambda: _c("rle_huffman").encode_stream(skewed, 22),
        "rle_huffman decode": lambda: _c("rle_huffman").decode_symbols(*rle_args, out[:n]),
        "quant": lambda: _c("quant").seg_minmax(src.view(np.float32), 256, src[:0], lo, hi),
        "select": lambda: _c("select").keys_hist(src.view(np.uint32), src[:0], np.uint32(16),
                                                 np.uint32(0x7F800000), counts),
        "planes encode": lambda: pk.huffman_encode(skewed, block, freq, coded),
        "planes decode": lambda: pk.huffman_decode(stream, block, out[:n]),
        "floats": lambda: _c("floats").f16_bits(words, out.view(np.uint16)[:n]),
        "kmeans fit": lambda: _c("kmeans").fit_codebooks(x, x.view(np.uint32), 1 << 16,
                                                         np.zeros(0, np.uint8), 256, 0.3, 0,
                                                         book),
        "kmeans codes": lambda: _c("kmeans").nearest_codes(x, 1 << 16, book, out[:x.size]),
        "adaptive": lambda: _c("adaptive").histogram_search(src.view(np.float32), 4096,
                                                            src[:0], counts[:0], alo, ahi, 16,
                                                            45, 1.0),
    }


def test_the_probe_sees_a_call_that_holds_the_gil():
    src = _bytes(1 << 25)
    assert progress_during(lambda: bytes(src)) == [0, 0, 0]


@pytest.mark.parametrize("kernel", ["bytegroup", "split_rows", "bitpack", "delta",
                                    "rle_huffman encode", "rle_huffman decode", "quant",
                                    "select", "planes encode", "planes decode", "floats",
                                    "kmeans fit", "kmeans codes", "adaptive"])
def test_kernels_release_the_gil(kernel):
    assert any(progress_during(_big_calls()[kernel]))
