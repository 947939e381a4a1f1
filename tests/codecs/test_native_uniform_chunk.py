"""A whole uniform or adaptive Quantize chunk in one call
(``ckptcodecs.encode_uniform_chunk``, C) against the steps it stands for,
``encode_chunk(*quantize(...))`` and ``rle_huffman_encode(chunk, min_saving)``, a kernel call
each: the same bytes on every kind of value, bit width, method,
segment length, entropy gate and float width (float32, float16, bfloat16), on each CPU path;
None exactly where quantize's special cases need its steps (values that are not finite,
subnormal scales, no values); RLEHuffman's own one call against its steps; hostile arguments
raise ValueError; the call runs without the GIL; the stores' codec and the numcodecs codec use
it only where it writes what the steps write."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptcodecs import (CodecError, Quantize, _backend, encode_chunk, encode_uniform_chunk,
                        quantize, rle_huffman_encode)
from ckptcodecs import rle_huffman as RH
from ckptcodecs.floats import to_bf16_bits
from ckptcodecs.uniform_chunk import one_call_applies
from ckptstore.chunkcodec.quantized import QuantizedLossy
from helpers import spins_during

pytestmark = [pytest.mark.skipif(
    _backend.CHOICE != "c", reason="the one call is the compiled kernels' (CKPTCODECS_KERNELS="
    "numba, or no build: the steps run, as the reference)"),
    pytest.mark.usefixtures("each_simd_path")]  # the baseline and AVX2 builds of its loops

KINDS = ["normal", "runs", "constant", "huge", "tiny", "subnormal", "specials"]
METHODS = ["uniform-asymmetric", "uniform-symmetric", "adaptive-asymmetric"]


def _values(seed: int, shape: tuple[int, ...], kind: str) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    x = rng.standard_normal(n) * 0.05
    if kind == "runs":  # few distinct values in long stretches: RLE pays
        x = np.repeat(np.round(rng.standard_normal(n // 40 + 1)), 40)[:n]
    elif kind == "constant":
        x = np.full(n, rng.standard_normal())
    elif kind == "huge":  # ranges wider than float32: the scale is FLT_MAX
        x = np.where(x > 0, 0.9, -0.9) * float(np.finfo(np.float32).max)
    elif kind == "tiny":
        x = x * 1e-30
    elif kind == "subnormal":  # scales below float32's normal range: quantize's float64 steps
        x = x * 1e-42
    elif kind == "specials" and n:  # NaN and infinities: quantize protects them
        x[rng.integers(0, n, max(1, n // 50))] = rng.choice([np.nan, np.inf, -np.inf])
    return x.astype(np.float32).reshape(shape)


def _as(x: np.ndarray, width: str) -> tuple[np.ndarray, str | None]:
    """``x`` as float32, float16, or bfloat16 bits (a uint16 array and dtype "bfloat16")."""
    if width == "bfloat16":
        return to_bf16_bits(x), "bfloat16"
    with np.errstate(over="ignore"):
        return x.astype(width), None


def _steps(x: np.ndarray, method: str, bits: int, granularity: str, group_size: int | None,
           entropy: bool, min_saving: float, dtype: str | None = None, **search) -> bytes:
    codes, params = quantize(x, method, bits, granularity=granularity, group_size=group_size,
                             dtype=dtype, **search)
    chunk = encode_chunk(codes, params)
    return rle_huffman_encode(chunk, min_saving) if entropy else chunk


def _check(x, method, bits, granularity, group_size, entropy, min_saving, dtype=None,
           **search) -> bytes | None:
    """``search``: the adaptive method's num_bins and ratio."""
    got = encode_uniform_chunk(x, method, bits, granularity, group_size, entropy=entropy,
                               min_saving=min_saving, dtype=dtype, **search)
    if got is None:  # only where quantize's special cases apply
        if x.size:
            _, p = quantize(x, method, bits, granularity=granularity, group_size=group_size,
                            dtype=dtype, **search)
            with np.errstate(over="ignore", divide="ignore"):
                subnormal = not np.isfinite(np.float32(1) / p.scale[p.scale > 0]).all()
            assert p.protected.size or subnormal  # non-finite values, or float64 steps
        return None
    assert got == _steps(x, method, bits, granularity, group_size, entropy, min_saving, dtype,
                         **search)
    return got


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**31), rows=st.integers(0, 40), cols=st.integers(1, 300),
       kind=st.sampled_from(KINDS), method=st.sampled_from(METHODS), bits=st.integers(1, 8),
       granularity=st.sampled_from(["row", "tensor", "group"]), group=st.integers(1, 200),
       entropy=st.booleans(), min_saving=st.sampled_from([0.0, 0.08, 0.5]),
       width=st.sampled_from(["float32", "float16", "bfloat16"]))
def test_one_call_writes_what_the_steps_write(seed, rows, cols, kind, method, bits, granularity,
                                              group, entropy, min_saving, width):
    x, dtype = _as(_values(seed, (rows, cols), kind), width)
    _check(x, method, bits, granularity, group if granularity == "group" else None, entropy,
           min_saving, dtype)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), rows=st.integers(1, 30), cols=st.integers(1, 700),
       kind=st.sampled_from(["normal", "runs", "constant", "huge", "tiny", "specials"]),
       bits=st.integers(1, 8), num_bins=st.sampled_from([None, 2, 5, 25, 45, 60]),
       ratio=st.sampled_from([1.0, 0.9, 0.5, 0.05]),
       width=st.sampled_from(["float32", "float16", "bfloat16"]))
def test_adaptive_one_call_with_its_search_parameters(seed, rows, cols, kind, bits, num_bins,
                                                      ratio, width):
    """The adaptive method's one call (its search run from C: the histogram search on long
    rows, the exact one on short) with any number of bins and ratio: quantize's bytes."""
    x, dtype = _as(_values(seed, (rows, cols), kind), width)
    _check(x, "adaptive-asymmetric", bits, "row", None, True, 0.08, dtype, num_bins=num_bins,
           ratio=ratio)


@pytest.mark.parametrize("shape", [(3000, 64), (301, 128), (5, 9000), (7, 3001), (129, 65)])
@pytest.mark.parametrize("kind", ["normal", "specials"])
def test_adaptive_one_call_a_group_of_rows_at_a_time(shape, kind):
    """The one call runs its steps on groups of rows of about 32 KiB (an even number: the
    search pairs rows by parity), the last group shorter, a non-finite value in any group:
    quantize's bytes, which search all rows in one call."""
    x = _values(sum(shape), shape, "normal")
    if kind == "specials":  # one non-finite value, in the last group only
        x[-1, -1] = np.inf
    for bits in (2, 4, 8):
        _check(x, "adaptive-asymmetric", bits, "row", None, True, 0.08)
    _check(*_as(x, "bfloat16")[:1], "adaptive-asymmetric", 4, "row", None, True, 0.08,
           "bfloat16")


@pytest.mark.parametrize("method", METHODS)
def test_a_group_larger_than_any_chunk(method):
    """A group size near the largest integer (one segment): quantize's bytes, where the
    segment count once overflowed."""
    x = _values(3, (40, 30), "normal")
    _check(x, method, 4, "group", (1 << 63) - 1, True, 0.08)


def test_adaptive_one_call_refuses_what_the_search_refuses():
    """A ratio past the range or NaN, bins past the histogram's limit: ValueError, as the
    search's own wrappers raise."""
    call = _backend.native().quant_encode_adaptive
    x = _values(2, (16, 64), "normal").reshape(-1)
    for bins, ratio, says in [(45, 1.5, "a ratio of 1.5"), (45, float("nan"), "NaN"),
                              (1 << 30, 1.0, "1073741824 bins")]:
        with pytest.raises(ValueError, match=says):
            call(x, 64, 4, bins, ratio, True, 0.0, 0)
    with pytest.raises(ValueError, match="min_saving 1.5 is not"):
        call(x, 64, 4, 45, 1.0, True, 1.5, 0)
    for kw in [{"ratio": 0.0}, {"ratio": 1.01}, {"num_bins": 1}]:  # as quantize raises
        with pytest.raises(CodecError):
            encode_uniform_chunk(x, "adaptive-asymmetric", 4, **kw)
        with pytest.raises(CodecError):
            quantize(x, "adaptive-asymmetric", 4, **kw)
    with pytest.raises(ValueError):
        call(x, 64, 9, 45, 1.0, True, 0.0, 0)


@pytest.mark.parametrize("kind", ["normal", "runs", "constant", "huge"])
@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("min_saving", [0.0, 0.08, 0.3])
@pytest.mark.parametrize("width", ["float32", "bfloat16"])
def test_chunks_the_entropy_gate_samples(kind, bits, min_saving, width):
    """Chunks of 64 KiB and more, where the gate reads its sample: coded or raw alike."""
    x, dtype = _as(_values(bits, (2048, 96), kind), width)
    got = _check(x, "uniform-asymmetric", bits, "row", None, True, min_saving, dtype)
    assert got is not None and got[0] == 1  # RLEHuffman version 1


@pytest.mark.parametrize("kind", ["specials", "subnormal"])
def test_special_cases_are_left_to_the_steps(kind):
    x = _values(1, (64, 64), kind)
    assert encode_uniform_chunk(x, "uniform-asymmetric", 8, entropy=True) is None
    assert encode_uniform_chunk(np.zeros(0, np.float32), "uniform-asymmetric", 8) is None
    assert encode_uniform_chunk(x.astype(np.float64), "uniform-asymmetric", 8) is None
    assert encode_uniform_chunk(x, "kmeans", 8) is None
    assert encode_uniform_chunk(to_bf16_bits(x), "uniform-asymmetric", 8) is None  # no dtype
    assert encode_uniform_chunk(x, "uniform-asymmetric", 8, dtype="bfloat16") is None


def test_hostile_arguments_raise():
    call = _backend.native().quant_encode_uniform
    x = _values(2, (16, 16), "normal").reshape(-1)
    for args in [(x, 0, 8, False, True, 0.0, 0), (x, 16, 0, False, True, 0.0, 0),
                 (x, 16, 9, False, True, 0.0, 0), (x, 16, 8, False, True, 1.0, 0),
                 (x, 16, 8, False, True, -0.1, 0), (x.astype(np.float64), 16, 8, False, True,
                                                    0.0, 0),
                 (x, 16, 8, False, True, 0.0, 1), (x, 16, 8, False, True, 0.0, 3),
                 (to_bf16_bits(x), 16, 8, False, True, 0.0, 0)]:
        with pytest.raises(ValueError):
            call(*args)
    with pytest.raises((ValueError, BufferError)):
        call(x.reshape(16, 16)[:, ::2], 8, 8, False, True, 0.0, 0)


def test_the_one_call_releases_the_gil():
    x = _values(3, (16384, 256), "normal")
    assert spins_during(lambda: encode_uniform_chunk(x, "uniform-asymmetric", 8,
                                                     entropy=True)) > 0


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.one_of(st.integers(0, 5000), st.integers(60000, 300000)),
       spread=st.sampled_from([0.5, 4.0, 40.0]), run=st.sampled_from([1, 3, 50]),
       min_saving=st.sampled_from([0.0, 0.08, 0.3]))
def test_rle_huffman_one_call_writes_what_its_steps_write(seed, n, spread, run, min_saving):
    rng = np.random.default_rng(seed)
    a = np.clip(rng.standard_normal(n // run + 1) * spread + 128, 0, 255).astype(np.uint8)
    a = np.repeat(a, run)[:n].copy()
    assert RH.rle_huffman_encode(a, min_saving) == RH._encode_steps(a, min_saving)


def test_codecs_use_the_one_call_only_where_it_applies():
    assert one_call_applies("uniform-asymmetric")
    assert not one_call_applies("uniform-asymmetric", protect=0.01)
    assert not one_call_applies("uniform-asymmetric", prune=0.01)
    assert not one_call_applies("uniform-asymmetric", param_dtype="float16")
    assert not one_call_applies("uniform-asymmetric", protect_mode="sparse")
    assert one_call_applies("adaptive-asymmetric")
    assert not one_call_applies("adaptive-asymmetric", param_dtype="float16")
    assert not one_call_applies("kmeans")
    x = _values(4, (300, 64), "normal")
    q = Quantize("uniform-symmetric", 6)
    codes, params = quantize(x, "uniform-symmetric", 6)
    assert q.encode(x) == encode_chunk(codes, params)
    assert q.encode_one_call(x) == encode_chunk(codes, params)
    assert Quantize("uniform-asymmetric", 8, protect=0.01).encode_one_call(x) is None
    b16 = to_bf16_bits(x)
    assert Quantize("uniform-asymmetric", 8, dtype="bfloat16").encode(b16) == encode_chunk(
        *quantize(b16, "uniform-asymmetric", 8, dtype="bfloat16"))
    codec = QuantizedLossy({"method": "uniform-asymmetric", "bits": 8})
    body, crc = codec.encode(x)
    assert bytes(body) == rle_huffman_encode(encode_chunk(*quantize(x, "uniform-asymmetric", 8)),
                                             codec._min_saving)
    pruned = QuantizedLossy({"method": "uniform-asymmetric", "bits": 8}, prune_zeros=True)
    x[::7] = 0
    body, crc = pruned.encode(x)  # the steps: zeros get the prune code
    codes, params = pruned.decode_codes(bytes(body) + crc, "chunk")
    assert params.has_prune and np.count_nonzero(codes == params.prune_code) == x[::7].size
