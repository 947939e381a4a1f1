"""The registered codecs under numcodecs' own test helpers (``numcodecs.tests.common``, issue 13).

What numcodecs' codecs do and so must ours: encode bytes, bytearray, array.array, memoryview and
numpy arrays (C- or F-ordered, read in memory order); decode any of them, also into a given
``out`` buffer; refuse object arrays with ``TypeError``; round-trip their config through JSON and
the registry; ``repr`` that evaluates back to the codec; parameters checked at construction.
``check_backwards_compatibility`` runs on the committed fixtures of tests/data/codecs, laid out the
way numcodecs' helper reads them.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from numcodecs.compat import ensure_ndarray
from numcodecs.registry import get_codec
from numcodecs.tests import common as nc

import ckptcodecs
from ckptcodecs import BucketDelta, BytePlanes, CodecError, CodecTypeError, Quantize, RLEHuffman
from ckptcodecs._floats import to_bf16_bits
from common import fixture_cases, fixture_paths

RNG = np.random.default_rng(13)
CODECS = {"ckpt.quantize": Quantize, "ckpt.rle_huffman": RLEHuffman,
          "ckpt.byte_planes": BytePlanes}


def _grid(shape: tuple[int, ...], order: str = "C") -> np.ndarray:
    """Integers 0..15, all present: a 4-bit uniform tensor quantizer stores them exactly."""
    n = int(np.prod(shape))
    return np.asarray((np.arange(n) * 7) % 16, np.float32).reshape(shape, order=order)


UNIT = RNG.uniform(-1, 1, (8, 32)).astype(np.float32)
GRID = _grid((8, 16))

# (codec, array, precision): precision None = exact (numcodecs compares bytes), else decimals
ENCODE_DECODE = [
    # Quantize, exact: integer grids, whole tensor as one segment
    (Quantize(bits=4, granularity="tensor", dtype="float32"), GRID, None),
    (Quantize(bits=4, granularity="tensor", dtype="float32"), _grid((8, 16), "F"), None),
    (Quantize(bits=4, granularity="tensor", dtype="float32"), _grid((2, 4, 16)), None),
    (Quantize(bits=4, granularity="tensor", dtype="float16"), GRID.astype(np.float16), None),
    (Quantize(bits=4, granularity="tensor", dtype="float64"), GRID.astype(np.float64), None),
    (Quantize(bits=4, granularity="tensor", dtype="bfloat16"), to_bf16_bits(GRID), None),
    (Quantize(bits=4, granularity="tensor", dtype="bfloat16"),
     np.asfortranarray(to_bf16_bits(GRID)), None),
    # Quantize, lossy: values in [-1, 1] within the error bound of each method
    (Quantize(bits=8, dtype="float32"), UNIT, 2),
    (Quantize(bits=8, dtype="float32"), np.asfortranarray(UNIT), 2),
    (Quantize("uniform-symmetric", 8, dtype="float32"), UNIT, 2),
    (Quantize("adaptive-asymmetric", 8, dtype="float32"), UNIT, 1),
    (Quantize("kmeans", 8, granularity="tensor", dtype="float32"), UNIT, 2),
    (Quantize(bits=8, granularity="group", group_size=16, protect=0.05, protect_mode="sparse",
              param_dtype="float16", dtype="float32"), UNIT, 2),
    (Quantize(bits=8, protect=0.05, prune=0.05, dtype="float64"), UNIT.astype(np.float64), 1),
    # BytePlanes: lossless over numbers of its itemsize
    (BytePlanes(itemsize=4), UNIT, None),
    (BytePlanes(itemsize=4), np.asfortranarray(UNIT), None),
    (BytePlanes(itemsize=2), to_bf16_bits(UNIT), None),
    (BytePlanes(itemsize=8, rotate=False, block=4096), UNIT.astype(np.float64), None),
    (BytePlanes(itemsize=1), RNG.integers(-3, 3, (40, 50)).astype(np.int8), None),
    (BytePlanes(itemsize=4, block=4096),  # planes above SMALL: sampled, zstd for the zero rows
     np.where(RNG.random((200, 1)) < 0.6, 0,
              RNG.standard_normal((200, 64)) * 0.05).astype(np.float32), None),
    # RLEHuffman: lossless over bytes
    (RLEHuffman(), np.repeat(RNG.integers(0, 5, 60), RNG.integers(1, 30, 60)).astype(np.uint8),
     None),
    (RLEHuffman(), RNG.integers(0, 256, 500).astype(np.uint8), None),
    (RLEHuffman(), np.zeros((16, 24), np.uint8, order="F"), None),
    (RLEHuffman(), np.arange(300, dtype=np.int32).reshape(10, 30), None),
]


def _case_id(i: int, codec, arr: np.ndarray) -> str:
    order = "C" if arr.flags.c_contiguous else "F"
    return f"{type(codec).__name__}-{arr.dtype}-{order}{arr.ndim}d-{i}"


@pytest.mark.parametrize("codec,arr,precision", ENCODE_DECODE,
                         ids=[_case_id(i, c, a) for i, (c, a, _) in enumerate(ENCODE_DECODE)])
def test_check_encode_decode(codec, arr, precision):
    nc.check_encode_decode(arr, codec, precision=precision)


@pytest.mark.parametrize("codec,arr", [
    (Quantize(bits=4, granularity="tensor", dtype="float32"), GRID),
    (Quantize(bits=4, granularity="tensor", dtype="bfloat16"), to_bf16_bits(GRID)),
    (RLEHuffman(), RNG.integers(0, 4, 300).astype(np.uint8)),
    (BytePlanes(itemsize=1), RNG.integers(0, 4, 300).astype(np.uint8)),
])
def test_check_encode_decode_array(codec, arr):
    # decode returns an ndarray of the input's dtype (bytes codecs: of uint8 input)
    nc.check_encode_decode_array(arr, codec)


CONFIGS = [
    Quantize(), Quantize("kmeans", 3, granularity="tensor", protect=0.001, prune=0.2, levels=5,
                         lam=0.8),
    Quantize("adaptive-asymmetric", 2, num_bins=30, ratio=0.6),
    Quantize(granularity="group", group_size=64, dtype="bfloat16"),
    Quantize("uniform-symmetric", 3, protect=0.01, protect_mode="sparse", param_dtype="float16",
             dtype="float64"),
    Quantize(bits=np.int64(6), protect=np.float32(0.25), dtype=np.float32),  # numpy scalars
    RLEHuffman(), BytePlanes(), BytePlanes(itemsize=2, rotate=False, block=4096),
    BytePlanes(itemsize=np.int32(8), rotate=np.bool_(True)),
]


@pytest.mark.parametrize("codec", CONFIGS, ids=repr)
def test_config_roundtrips(codec):
    nc.check_config(codec)  # JSON + numcodecs.registry.get_codec
    config = codec.get_config()
    assert config["id"] == codec.codec_id == type(codec).codec_id
    assert json.loads(json.dumps(config)) == config  # plain JSON types (dtype as its name)
    assert type(codec).from_config({k: v for k, v in config.items() if k != "id"}) == codec
    assert eval(repr(codec), vars(ckptcodecs)) == codec


def test_dtype_spellings_normalise_to_names():
    for spelling in (np.float32, "f4", "<f4", np.dtype("float32"), "float32"):
        assert Quantize(dtype=spelling).get_config()["dtype"] == "float32"
    assert Quantize(dtype="bfloat16").dtype == "bfloat16"


@pytest.mark.parametrize("codec_id,cls", sorted(CODECS.items()))
def test_registry_get_codec(codec_id, cls):
    # registered on import; a process that never imports ckptcodecs finds them through the
    # numcodecs.codecs entry points (test_codec_zarr3.test_numcodecs_entry_points_in_fresh_process)
    assert get_codec({"id": codec_id}) == cls()
    assert type(get_codec({"id": codec_id})) is cls


@pytest.mark.parametrize("stmt", [
    "Quantize(method='kmeans', bits=3, granularity='tensor', group_size=None, protect=0.001, "
    "prune=0.0, levels=None, num_bins=None, ratio=1.0, lam=1.0, dtype=None)",
    "Quantize(method='uniform-asymmetric', bits=2, granularity='row', group_size=None, "
    "protect=0.02, prune=0.0, levels=None, num_bins=None, ratio=1.0, lam=1.0, dtype='bfloat16', "
    "protect_mode='sparse', param_dtype='float16')",
    "RLEHuffman()",
    "BytePlanes(itemsize=2, rotate=False, block=4096)",
])
def test_check_repr(stmt, monkeypatch):
    # numcodecs' check_repr evals in its own module, which knows numcodecs' codecs only: give it
    # ours by name (no behaviour is replaced)
    for name in ("Quantize", "RLEHuffman", "BytePlanes"):
        monkeypatch.setattr(nc, name, getattr(ckptcodecs, name), raising=False)
    nc.check_repr(stmt)


FIXTURES = fixture_cases()


@pytest.mark.parametrize("name,codec", [(c[0], c[1]) for c in FIXTURES])
def test_check_backwards_compatibility(name, codec, tmp_path, monkeypatch):
    # numcodecs' layout, fixture/<codec_id>/<prefix>/{array.00.npy, codec.00/{config.json,
    # encoded.00.dat}}, filled from the committed fixture; the array is the stored decoding in the
    # original shape, so the helper checks the decoded bytes exactly (lossy codecs included)
    p = fixture_paths(name)
    orig = np.load(p["array"])
    expect = np.load(p["decoded"]).reshape(-1).view(orig.dtype).reshape(orig.shape)
    if not isinstance(codec, Quantize):
        np.testing.assert_array_equal(expect, orig)  # lossless
    d = tmp_path / "fixture" / codec.codec_id / name
    (d / "codec.00").mkdir(parents=True)
    np.save(d / "array.00.npy", expect)
    shutil.copy(p["config"], d / "codec.00" / "config.json")
    shutil.copy(p["encoded"], d / "codec.00" / "encoded.00.dat")
    before = sorted(tmp_path.rglob("*"))
    monkeypatch.chdir(tmp_path)
    nc.check_backwards_compatibility(codec.codec_id, [expect], [codec], prefix=name)
    assert sorted(tmp_path.rglob("*")) == before  # read only: nothing was (re)written


@pytest.mark.parametrize("codec", [Quantize(dtype="float32"), RLEHuffman(), BytePlanes(),
                                   BucketDelta(4, np.zeros(3, np.uint8))], ids=repr)
def test_check_err_encode_object_buffer(codec):
    nc.check_err_encode_object_buffer(codec)
    with pytest.raises(CodecTypeError):  # the package's own class, a TypeError
        codec.encode(np.array([b"a", 1, None], dtype=object))
    with pytest.raises(CodecTypeError):  # nor is an object array a payload
        codec.decode(np.array([b"a", 1, None], dtype=object))


@pytest.mark.parametrize("codec", [RLEHuffman(), BytePlanes(itemsize=8), BytePlanes(itemsize=1)],
                         ids=repr)
def test_check_err_decode_object_buffer(codec):
    nc.check_err_decode_object_buffer(codec)


def test_quantize_err_decode_object_buffer():
    # numcodecs' helper encodes np.arange(10) (int64), which Quantize refuses (not float data,
    # numcodecs' own Quantize does not run that helper either); the same check on floats
    codec = Quantize(dtype="float64")
    enc = codec.encode(np.arange(10, dtype=np.float64))
    with pytest.raises(TypeError):
        codec.decode(enc, out=np.empty(10, dtype=object))
    with pytest.raises(CodecError, match="float"):
        Quantize().encode(np.arange(10))  # a typed non-float array is still refused


CASES_OUT = [(Quantize(bits=8, dtype="float32"), UNIT), (RLEHuffman(), UNIT),
             (BytePlanes(itemsize=4), UNIT),
             (BucketDelta(4, RNG.integers(0, 4, 256).astype(np.uint8)),
              RNG.integers(0, 4, 256).astype(np.uint8))]


@pytest.mark.parametrize("codec,arr", CASES_OUT, ids=[repr(c) for c, _ in CASES_OUT])
def test_decode_out(codec, arr):
    enc = codec.encode(arr)
    dec = np.asarray(codec.decode(enc)).reshape(-1)
    for out in (np.empty_like(arr), np.empty(arr.shape[::-1], arr.dtype, order="F"),
                bytearray(arr.nbytes), np.empty(arr.nbytes, np.uint8)):
        assert codec.decode(enc, out=out) is out  # filled in place and returned
        assert ensure_ndarray(out).tobytes(order="A") == dec.tobytes()  # in memory order
    f = np.empty(arr.shape, arr.dtype, order="F")
    codec.decode(enc, out=f)  # memory order: the bytes of out are the decoded bytes
    assert f.T.tobytes() == dec.tobytes()
    for wrong in (np.empty(arr.size + 1, arr.dtype), np.empty(arr.size - 1, arr.dtype),
                  bytearray(arr.nbytes + 1)):
        with pytest.raises(CodecError, match=f"decodes to {dec.nbytes} bytes, out holds"):
            codec.decode(enc, out=wrong)
    with pytest.raises(CodecError, match="writeable"):
        codec.decode(enc, out=bytes(arr.nbytes))
    with pytest.raises(CodecTypeError, match="object"):
        codec.decode(enc, out=np.empty(arr.size, object))


def test_quantize_raw_bytes_read_as_configured_dtype():
    codec = Quantize(bits=8, dtype="float32")
    flat = UNIT.reshape(-1)
    for raw in (UNIT.tobytes(), bytearray(UNIT.tobytes()), memoryview(UNIT.tobytes()),
                np.frombuffer(UNIT.tobytes(), np.uint8)):
        assert codec.encode(raw) == codec.encode(flat)
    bf = Quantize(bits=8, dtype="bfloat16")
    assert bf.encode(to_bf16_bits(UNIT).tobytes()) == bf.encode(to_bf16_bits(flat))
    with pytest.raises(CodecError, match="whole number"):
        codec.encode(b"\x00" * 6)
    with pytest.raises(CodecError, match="bfloat16"):  # no dtype: bytes cannot be told apart
        Quantize().encode(UNIT.tobytes())
    with pytest.raises(CodecError):  # a float array of another dtype is still a mistake
        codec.encode(UNIT.astype(np.float64))


def test_quantize_f_order_is_memory_order():
    # an F-ordered array is encoded as its C-ordered transpose: rows run along its first axis
    codec = Quantize(bits=3)
    f = np.asfortranarray(UNIT)
    assert codec.encode(f) == codec.encode(np.ascontiguousarray(f.T))
    out = np.empty_like(f)
    codec.decode(codec.encode(f), out=out)
    bound = (UNIT.max(axis=0) - UNIT.min(axis=0)) / 7 / 2 + 1e-6  # per column = per segment
    assert (np.abs(out - f) <= bound).all()


@pytest.mark.parametrize("cls,kwargs,error", [
    (Quantize, {"bits": 9}, ValueError),
    (Quantize, {"bits": 0}, ValueError),
    (Quantize, {"bits": "4"}, TypeError),
    (Quantize, {"bits": 4.5}, TypeError),  # was silently truncated to 4
    (Quantize, {"bits": True}, TypeError),
    (Quantize, {"method": "nope"}, ValueError),
    (Quantize, {"method": None}, TypeError),
    (Quantize, {"granularity": "col"}, ValueError),
    (Quantize, {"granularity": "group"}, ValueError),
    (Quantize, {"granularity": "group", "group_size": 2.5}, TypeError),
    (Quantize, {"group_size": 0}, ValueError),
    (Quantize, {"protect": "x"}, TypeError),
    (Quantize, {"protect": float("nan")}, ValueError),
    (Quantize, {"protect": 0.6, "prune": 0.5}, ValueError),
    (Quantize, {"ratio": 0.0}, ValueError),
    (Quantize, {"lam": None}, TypeError),
    (Quantize, {"levels": 0}, ValueError),
    (Quantize, {"num_bins": 1}, ValueError),
    (Quantize, {"dtype": "int8"}, ValueError),
    (Quantize, {"dtype": ">f4"}, ValueError),
    (Quantize, {"dtype": "no-such-dtype"}, ValueError),
    (Quantize, {"dtype": 3.5}, TypeError),
    (Quantize, {"protect_mode": "both"}, ValueError),
    (Quantize, {"param_dtype": "float64"}, ValueError),
    # used to pass construction and fail at the first encode
    (Quantize, {"method": "kmeans", "bits": 3, "levels": 20}, ValueError),
    (Quantize, {"method": "kmeans", "bits": 2, "levels": 4, "protect": 0.1}, ValueError),
    (Quantize, {"bits": 1, "protect": 0.1, "prune": 0.1}, ValueError),
    (BytePlanes, {"itemsize": 3}, ValueError),
    (BytePlanes, {"itemsize": "4"}, TypeError),
    (BytePlanes, {"itemsize": 4.0}, TypeError),
    (BytePlanes, {"block": 1000}, ValueError),
    (BytePlanes, {"block": None}, TypeError),
    (BytePlanes, {"rotate": "no"}, TypeError),  # was bool("no") == True
    (BytePlanes, {"rotate": 0}, TypeError),
    (RLEHuffman, {"level": 1}, TypeError),
])
def test_bad_parameters_raise_at_construction(cls, kwargs, error):
    with pytest.raises(error) as info:
        cls(**kwargs)
    if cls is not RLEHuffman:  # the package's own classes (RLEHuffman takes no arguments)
        assert isinstance(info.value, CodecTypeError if error is TypeError else CodecError)
    with pytest.raises(error):  # and from a config, as zarr and numcodecs build codecs
        get_codec({"id": cls.codec_id, **kwargs})


def test_sparse_protection_leaves_room_for_levels():
    # protect_mode='sparse' spends no code on protection: all 2**bits levels for k-means
    Quantize("kmeans", 2, levels=4, protect=0.1, protect_mode="sparse")
    Quantize("kmeans", 2, levels=3, protect=0.1)
