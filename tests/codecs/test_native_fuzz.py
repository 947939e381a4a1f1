"""Fuzz targets, one per decoder of untrusted bytes (issue 28): hypothesis mutates valid payloads
(bit flips, bytes set to extremes, 8-byte fields overwritten with huge or negative values,
truncation, random tails, random bytes) and every decoder must either decode -- into a bounded
output -- or raise CodecError: no crash, no hang, no unbounded allocation.

The same file is the AddressSanitizer campaign: ``tests/codecs/asan_fuzz.py`` (``make fuzz``)
builds ``ckptcodecs._native`` with ``-fsanitize=address,undefined`` and runs this file against
that build, where an out-of-bounds read or write of a C kernel aborts the run instead of passing
unseen. ``CKPTCODECS_FUZZ_EXAMPLES`` sets the examples per target (the fixed budget; 40 here).

Self-contained on purpose (no conftest, no ckptstore, no torch): the ASan run loads it alone.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable

import numpy as np
from ckptcodecs import (
    BytePlanes,
    CodecError,
    Quantize,
    delta_decode,
    planes_decode_region,
    qdelta_decode,
    qdelta_encode,
    quantize,
    rle_huffman_decode,
    rle_huffman_encode,
    unpack_bits,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("CKPTCODECS_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 40,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
RNG = np.random.default_rng(28)


def _weights(n: int) -> np.ndarray:
    return (RNG.standard_normal(n) * 0.02).astype(np.float32)


def _planes_payloads() -> list[tuple[str, bytes, int]]:
    """BytePlanes payloads of each item size, with Huffman, zstd-worthy and raw planes."""
    w = _weights(20_000)
    bf16 = (w.view(np.uint32) >> 16).astype(np.uint16)
    runs = np.repeat(RNG.integers(0, 3, 400), RNG.integers(1, 80, 400)).astype(np.int64)
    cases = [("float32", w, 4), ("bf16", bf16, 2), ("float16", w.astype(np.float16), 2),
             ("int64-runs", runs, 8), ("random-bytes", RNG.integers(0, 256, 3001, np.uint8), 1)]
    out = []
    for name, arr, itemsize in cases:
        codec = BytePlanes(itemsize=itemsize, block=4096)
        out.append((name, bytes(memoryview(codec.encode(arr)).cast("B")), itemsize))
    return out


def _quantize_payloads() -> list[bytes]:
    x = _weights(3000).reshape(30, 100)
    x[3, 7], x[5, 1] = 1.5, -2.0  # outliers to protect
    codecs = [Quantize("uniform-asymmetric", 8), Quantize("adaptive-asymmetric", 4),
              Quantize("kmeans", 3, protect=0.01, granularity="tensor"),
              Quantize("kmeans", 4, protect=0.01, protect_mode="sparse", prune=0.1),
              Quantize("uniform-symmetric", 2, granularity="group", group_size=7,
                       param_dtype="float16")]
    return [bytes(memoryview(c.encode(x)).cast("B")) for c in codecs]


PLANES = _planes_payloads()
QUANTIZED = _quantize_payloads()
RLE = [rle_huffman_encode(np.repeat(RNG.integers(0, 9, 300), RNG.integers(1, 40, 300))
                          .astype(np.uint8).tobytes()),
       rle_huffman_encode(RNG.integers(0, 256, 5000, np.uint8).tobytes()),
       rle_huffman_encode(b"")]
_BASE_X = _weights(4000)
_BASE_CODES, _BASE_PARAMS = quantize(_BASE_X, "uniform-asymmetric", 4)
_NEW_CODES, _NEW_PARAMS = quantize(_BASE_X + _weights(4000) * 0.1, "uniform-asymmetric", 4)
QDELTA = bytes(qdelta_encode(_NEW_CODES, _NEW_PARAMS, _BASE_CODES, _BASE_PARAMS))


@st.composite
def mutated(draw, payloads: list[bytes]) -> bytes:
    """One of ``payloads``, changed the way corrupt or hostile storage changes bytes."""
    buf = bytearray(draw(st.sampled_from(payloads)))
    for _ in range(draw(st.integers(0, 4))):
        if not buf:
            break
        head = draw(st.booleans())  # headers and tables sit in the first bytes
        pos = draw(st.integers(0, min(len(buf), 96) - 1 if head else len(buf) - 1))
        edit = draw(st.sampled_from(["flip", "byte", "field"]))
        if edit == "flip":
            buf[pos] ^= 1 << draw(st.integers(0, 7))
        elif edit == "byte":
            buf[pos] = draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF]))
        else:
            value = draw(st.sampled_from([0, 1, 2**31 - 1, 2**32, 2**40, 2**62, 2**64 - 1]))
            field = struct.pack("<Q", value)[: max(0, min(8, len(buf) - pos))]
            buf[pos:pos + len(field)] = field
    shape = draw(st.sampled_from(["keep", "cut", "tail"]))
    if shape == "cut":
        buf = buf[:draw(st.integers(0, len(buf)))]
    elif shape == "tail":
        buf += draw(st.binary(min_size=1, max_size=64))
    return bytes(buf)


def _rle_header_signed(payload: bytes) -> bytes:
    """An RLEHuffman payload with its header checksum made right again, where the header is
    whole: what reaches the decoder kernel past the checksum (a mutated table, a wrong count)."""
    head = 10 + 12  # "<BBQ" version, mode, bytes; "<QI" symbols, table size
    if len(payload) < head or payload[1] != 1:
        return payload
    (nused,) = struct.unpack_from("<I", payload, head - 4)
    end = head + 3 * nused
    if not 1 <= nused <= 4096 or len(payload) < end + 4:
        return payload
    return payload[:end] + struct.pack("<I", zlib.crc32(payload[:end])) + payload[end + 4:]


def _bounded(decode: Callable[[], object], payload: bytes) -> None:
    """``decode()`` either raises CodecError or returns an output of bounded size."""
    try:
        out = decode()
    except CodecError:
        return
    arrays = out if isinstance(out, tuple) else (out,)
    size = sum(np.asarray(a).nbytes for a in arrays if isinstance(a, np.ndarray | bytes))
    assert size <= 4096 * len(payload) + (1 << 22)  # no runaway allocation


@FUZZ
@given(mutated([p for _, p, _ in PLANES]))
def test_fuzz_planes_decode(payload):
    _bounded(lambda: BytePlanes().decode(payload), payload)


@FUZZ
@given(st.data())
def test_fuzz_planes_decode_region(data):
    name, payload, itemsize = data.draw(st.sampled_from(PLANES))
    payload = data.draw(mutated([payload]))
    rows = data.draw(st.integers(1, 40))
    shape = (rows, data.draw(st.integers(1, 600)))
    r0 = data.draw(st.integers(0, rows - 1))
    c0 = data.draw(st.integers(0, shape[1] - 1))
    r1 = data.draw(st.integers(r0, rows))
    c1 = data.draw(st.integers(c0, shape[1]))
    dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[itemsize]
    out = np.zeros((r1 - r0, c1 - c0), dtype)
    _bounded(lambda: planes_decode_region(payload, shape, (r0, r1), (c0, c1), out), payload)


@FUZZ
@given(mutated(RLE), st.booleans())
def test_fuzz_rle_huffman_decode(payload, signed):
    if signed:
        payload = _rle_header_signed(payload)
    _bounded(lambda: rle_huffman_decode(payload), payload)


@FUZZ
@given(mutated(QUANTIZED))
def test_fuzz_quantize_decode(payload):
    _bounded(lambda: Quantize().decode(payload), payload)


@FUZZ
@given(mutated([QDELTA]))
def test_fuzz_qdelta_decode(payload):
    _bounded(lambda: qdelta_decode(payload, _BASE_CODES, _BASE_PARAMS), payload)


@FUZZ
@given(st.binary(max_size=300), st.binary(max_size=300), st.integers(-2, 300),
       st.integers(-2, 300))
def test_fuzz_delta_decode(residuals, base, k0, k1):
    res = np.frombuffer(residuals, np.uint8)
    codes = np.frombuffer(base, np.uint8)
    _bounded(lambda: delta_decode(res, codes, (k0, k1)), residuals + base)


@FUZZ
@given(st.binary(max_size=300), st.integers(-1, 9), st.integers(-5, 3000))
def test_fuzz_unpack_bits(packed, bits, count):
    buf = np.frombuffer(packed, np.uint8)
    _bounded(lambda: unpack_bits(buf, bits, count), packed)
