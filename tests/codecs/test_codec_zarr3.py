"""zarr v3 adapters: write with Quantize + RLEHuffman, read back in a process that imports only
zarr (the ``zarr.codecs`` entry points resolve the codecs)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import zarr
from ckptcodecs import CodecError, Quantize
from ckptcodecs._floats import from_bf16_bits, to_bf16_bits
from ckptcodecs.zarr3 import QuantizeCodec, RLEHuffmanCodec

RNG = np.random.default_rng(5)
X = RNG.standard_normal((70, 48)).astype(np.float32)


def _expected(x, chunks, **cfg):
    codec = Quantize(**cfg)
    out = np.empty_like(x)
    for i in range(0, x.shape[0], chunks[0]):
        blk = x[i:i + chunks[0]]
        if blk.shape[0] < chunks[0]:  # zarr pads edge chunks with the fill value
            pad = np.zeros((chunks[0],) + blk.shape[1:], x.dtype)
            pad[:blk.shape[0]] = blk
            blk = codec.decode(codec.encode(pad)).reshape(pad.shape)[:x.shape[0] - i]
        else:
            blk = codec.decode(codec.encode(blk)).reshape(blk.shape)
        out[i:i + chunks[0]] = blk
    return out


def test_write_then_read_in_fresh_process(tmp_path):
    path = str(tmp_path / "q.zarr")
    cfg = {"method": "adaptive-asymmetric", "bits": 4}
    a = zarr.create_array(path, shape=X.shape, chunks=(32, 48), dtype="float32",
                          serializer=QuantizeCodec(**cfg), compressors=[RLEHuffmanCodec()])
    a[:] = X
    expect = _expected(X, (32, 48), **cfg)
    np.testing.assert_array_equal(a[:], expect)
    np.save(tmp_path / "expect.npy", expect)
    script = textwrap.dedent(f"""
        import sys, numpy as np, zarr
        a = zarr.open_array({path!r})
        np.testing.assert_array_equal(a[:], np.load({str(tmp_path / "expect.npy")!r}))
        names = [c.to_dict()["name"] for c in a.metadata.codecs]
        assert names == ["ckpt.quantize", "ckpt.rle_huffman"], names
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr


def test_bfloat16_array_as_uint16(tmp_path):
    bits = to_bf16_bits(X)
    a = zarr.create_array(str(tmp_path / "b.zarr"), shape=X.shape, chunks=(35, 48),
                          dtype="uint16",
                          serializer=QuantizeCodec(method="kmeans", bits=4, dtype="bfloat16",
                                                   granularity="tensor", protect=0.01))
    a[:] = bits
    back = a[:]
    assert back.dtype == np.uint16
    assert np.abs(from_bf16_bits(back) - from_bf16_bits(bits)).mean() < 0.1


def test_metadata_roundtrip_and_validation(tmp_path):
    codec = QuantizeCodec(method="kmeans", bits=3, granularity="tensor", protect=0.001)
    assert QuantizeCodec.from_dict(codec.to_dict()) == codec
    assert RLEHuffmanCodec.from_dict(RLEHuffmanCodec().to_dict()) == RLEHuffmanCodec()
    with pytest.raises(CodecError):
        QuantizeCodec(bits=12)
    with pytest.raises((CodecError, ValueError)):
        zarr.create_array(str(tmp_path / "i.zarr"), shape=(4,), dtype="int32",
                          serializer=QuantizeCodec())


def test_rle_huffman_as_compressor_of_plain_bytes(tmp_path):
    codes = np.repeat(RNG.integers(0, 4, 300), 50).astype(np.uint8)
    a = zarr.create_array(str(tmp_path / "c.zarr"), shape=codes.shape, chunks=(4096,),
                          dtype="uint8", compressors=[RLEHuffmanCodec()])
    a[:] = codes
    np.testing.assert_array_equal(a[:], codes)


def test_numcodecs_entry_points_in_fresh_process():
    script = textwrap.dedent("""
        import sys, numpy as np, numcodecs
        assert "ckptcodecs" not in sys.modules  # found through the entry points only
        q = numcodecs.get_codec({"id": "ckpt.quantize", "bits": 3})
        r = numcodecs.get_codec({"id": "ckpt.rle_huffman"})
        p = numcodecs.get_codec({"id": "ckpt.byte_planes", "itemsize": 4})
        x = np.linspace(-1, 1, 64, dtype="float32")
        assert np.abs(q.decode(q.encode(x)) - x).max() < 0.15
        assert bytes(r.decode(r.encode(b"aaab"))) == b"aaab"
        assert bytes(p.decode(p.encode(x))) == x.tobytes()
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr


def test_float16_params_in_zarr_metadata(tmp_path):
    cfg = {"method": "uniform-asymmetric", "bits": 2, "param_dtype": "float16"}
    a = zarr.create_array(str(tmp_path / "h.zarr"), shape=(64, 16), chunks=(32, 16),
                          dtype="float32", serializer=QuantizeCodec(**cfg))
    x = X[:64, :16].copy()
    a[:] = x
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "h.zarr"))[:],
                                  _expected(x, (32, 16), **cfg))
    conf = [c.to_dict() for c in a.metadata.codecs][0]["configuration"]
    assert conf["param_dtype"] == "float16"
    plain = QuantizeCodec(method="uniform-asymmetric", bits=2).to_dict()["configuration"]
    assert "param_dtype" not in plain  # float32 metadata unchanged
