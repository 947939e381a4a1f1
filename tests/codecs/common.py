"""Helpers shared by the codec tests, in the manner of numcodecs/tests/common.py."""

from __future__ import annotations

import json
from pathlib import Path

import ckptcodecs
import numpy as np
from numcodecs.registry import get_codec

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "codecs"


def as_bytes(enc) -> bytes:
    return bytes(memoryview(np.ascontiguousarray(enc)).cast("B")) if not isinstance(
        enc, bytes) else enc


def check_encode_decode(arr: np.ndarray, codec, check) -> None:
    """Encode ``arr`` and decode the result from bytes, bytearray, ndarray and into ``out``.

    ``check(arr, decoded)`` asserts the codec's error bound (``np.testing.assert_array_equal``
    for lossless codecs); ``decoded`` is reshaped to ``arr``'s shape.
    """
    enc = codec.encode(arr)
    enc_bytes = as_bytes(enc)
    for form in (enc_bytes, bytearray(enc_bytes), np.frombuffer(enc_bytes, np.uint8)):
        dec = np.asarray(codec.decode(form))
        if dec.dtype != arr.dtype and dec.dtype == np.uint8:  # a bytes codec returns bytes
            dec = dec.view(arr.dtype)
        check(arr, dec.reshape(arr.shape))
    out = np.empty_like(arr)
    codec.decode(enc_bytes, out=out)
    check(arr, out)
    # encoding is deterministic
    assert as_bytes(codec.encode(arr)) == enc_bytes


def check_config(codec) -> None:
    """Config survives JSON and the registry: ``codec == get_codec(config)``."""
    config = codec.get_config()
    config2 = json.loads(json.dumps(config))
    assert get_codec(config2) == codec
    config2.pop("id")
    assert type(codec).from_config(config2) == codec


def check_repr(expect: str) -> None:
    """``repr(eval(expect)) == expect`` for a codec constructor expression."""
    codec = eval(expect, vars(ckptcodecs))
    assert repr(codec) == expect


def fixture_cases():
    """(name, codec, array) of every backward-compatibility fixture; append only, never edit."""
    from ckptcodecs import Quantize, RLEHuffman

    rng = np.random.default_rng(20261122)
    rows = rng.standard_normal((24, 40)).astype(np.float32)
    heavy = (rng.standard_t(3, size=(16, 64)) * 0.02).astype(np.float32)
    special = rows.copy()
    special[0, :3] = [np.nan, np.inf, -np.inf]
    special[1] = 0.5  # constant row
    f64 = rng.standard_normal((8, 33))
    bf16 = ckptcodecs._floats.to_bf16_bits(heavy)
    codes = np.repeat(rng.integers(0, 5, 200), rng.integers(1, 40, 200)).astype(np.uint8)
    cases = []
    for bits in (1, 2, 3, 4, 8):
        cases.append((f"quantize-uasym-{bits}", Quantize(bits=bits), rows))
    cases += [
        ("quantize-usym-3", Quantize("uniform-symmetric", 3), rows),
        ("quantize-adaptive-2", Quantize("adaptive-asymmetric", 2), heavy),
        ("quantize-adaptive-4-group", Quantize("adaptive-asymmetric", 4, granularity="group",
                                               group_size=50), heavy),
        ("quantize-kmeans-3-protect", Quantize("kmeans", 3, granularity="tensor", protect=0.01,
                                               prune=0.1), heavy),
        ("quantize-kmeans-5levels", Quantize("kmeans", 3, granularity="row", levels=5), rows),
        ("quantize-special", Quantize("uniform-asymmetric", 4, protect=0.02), special),
        ("quantize-float64", Quantize("adaptive-asymmetric", 3), f64),
        ("quantize-bf16", Quantize("kmeans", 4, dtype="bfloat16", granularity="tensor",
                                   protect=0.001), bf16),
        ("quantize-empty", Quantize(), np.zeros((0, 4), np.float32)),
        ("rle-huffman-runs", RLEHuffman(), codes),
        ("rle-huffman-random", RLEHuffman(), rng.integers(0, 256, 3000).astype(np.uint8)),
        ("rle-huffman-empty", RLEHuffman(), np.zeros(0, np.uint8)),
        ("rle-huffman-one", RLEHuffman(), np.full(1, 7, np.uint8)),
        # protect_mode="sparse" (format version 2)
        ("quantize-sparse-kmeans-3", Quantize("kmeans", 3, granularity="tensor", protect=0.01,
                                              prune=0.1, protect_mode="sparse"), heavy),
        ("quantize-sparse-kmeans-2", Quantize("kmeans", 2, granularity="row", protect=0.02,
                                              protect_mode="sparse"), rows),
        ("quantize-sparse-special", Quantize("uniform-asymmetric", 4, protect=0.02,
                                             protect_mode="sparse"), special),
        ("quantize-sparse-gaps", Quantize("adaptive-asymmetric", 3, protect=0.004,
                                          protect_mode="sparse"), rows),  # 2-byte varints
        ("quantize-sparse-float64", Quantize("uniform-symmetric", 2, granularity="tensor",
                                             protect=0.05, protect_mode="sparse"), f64),
        ("quantize-sparse-bf16", Quantize("kmeans", 4, dtype="bfloat16", granularity="tensor",
                                          protect=0.01, protect_mode="sparse"), bf16),
        ("quantize-sparse-empty", Quantize(protect=0.01, protect_mode="sparse"),
         np.zeros((0, 4), np.float32)),
    ]
    # param_dtype="float16" (flag bit 2 of the chunk header); arrays from a generator of their own
    rng16 = np.random.default_rng(20261123)
    narrow = (rng16.standard_normal((64, 16)) * 0.05).astype(np.float32)
    wide = rng16.standard_normal((6, 40)).astype(np.float32)
    wide[1] *= 1e5  # beyond the float16 range: the chunk keeps float32 parameters
    cases += [
        ("quantize-f16-uasym-2-rows16", Quantize(bits=2, param_dtype="float16"), narrow),
        ("quantize-f16-adaptive-4", Quantize("adaptive-asymmetric", 4, param_dtype="float16"),
         heavy),
        ("quantize-f16-kmeans-3", Quantize("kmeans", 3, param_dtype="float16"), narrow),
        ("quantize-f16-bf16", Quantize("uniform-asymmetric", 4, dtype="bfloat16",
                                       param_dtype="float16"), bf16),
        ("quantize-f16-sparse", Quantize("adaptive-asymmetric", 3, protect=0.02,
                                         protect_mode="sparse", param_dtype="float16"), narrow),
        ("quantize-f16-float64", Quantize("uniform-symmetric", 3, param_dtype="float16"), f64),
        ("quantize-f16-fallback", Quantize(bits=4, param_dtype="float16"), wide),
    ]
    # BytePlanes (format version 1); arrays from a generator of their own
    from ckptcodecs import BytePlanes
    rngp = np.random.default_rng(20261124)
    weights = (rngp.standard_normal((300, 64)) * 0.05).astype(np.float32)
    moments = weights.copy()
    moments[rngp.random(300) < 0.6] = 0  # zero rows: zstd planes
    cases += [
        ("byte-planes-f32", BytePlanes(itemsize=4, block=4096), weights),
        ("byte-planes-bf16", BytePlanes(itemsize=2, block=4096),
         ckptcodecs._floats.to_bf16_bits(weights)),
        ("byte-planes-f64", BytePlanes(itemsize=8, block=4096), f64),
        ("byte-planes-zero-rows", BytePlanes(itemsize=4, block=4096), moments),
        ("byte-planes-int8", BytePlanes(itemsize=1, block=4096), codes.astype(np.int8)),
        ("byte-planes-empty", BytePlanes(), np.zeros(0, np.float32)),
    ]
    return cases


def fixture_paths(name: str) -> dict[str, Path]:
    d = FIXTURES / name
    return {"dir": d, "array": d / "array.npy", "config": d / "config.json",
            "encoded": d / "encoded.dat", "decoded": d / "decoded.npy"}


def write_missing_fixture(name: str, codec, arr: np.ndarray) -> bool:
    """Write the files of one fixture that do not exist yet; never overwrite. True if written."""
    p = fixture_paths(name)
    p["dir"].mkdir(parents=True, exist_ok=True)
    wrote = False
    if not p["array"].exists():
        np.save(p["array"], arr)
        wrote = True
    if not p["config"].exists():
        p["config"].write_text(json.dumps(codec.get_config(), sort_keys=True, indent=2) + "\n")
        wrote = True
    if not p["encoded"].exists():
        p["encoded"].write_bytes(as_bytes(codec.encode(np.load(p["array"]))))
        wrote = True
    if not p["decoded"].exists():
        np.save(p["decoded"], np.asarray(codec.decode(p["encoded"].read_bytes())))
        wrote = True
    return wrote


def check_backwards_compatibility(name: str) -> None:
    """The stored encoded bytes decode, with the stored config, to the stored decoded array."""
    p = fixture_paths(name)
    missing = [k for k, v in p.items() if not v.exists()]
    assert not missing, (f"fixture {name} lacks {missing}: run "
                         "`python tests/codecs/test_codec_backcompat.py` to write it (once)")
    codec = get_codec(json.loads(p["config"].read_text()))
    expect = np.load(p["decoded"])
    dec = np.asarray(codec.decode(p["encoded"].read_bytes()))
    assert dec.dtype == expect.dtype
    assert dec.tobytes() == expect.tobytes(), f"fixture {name} decodes differently"
