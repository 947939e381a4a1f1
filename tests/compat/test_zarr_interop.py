"""Plain zarr (no ckptstore code) reads every array of a full commit, checksums included, and
opens code-delta arrays (whose values only ckptstore can rebuild)."""

from __future__ import annotations

import pathlib
import warnings

import numpy as np
import pytest
import torch
import zarr
from ckptcodecs import CodecError

import ckptstore
from ckptstore import EncodingOptions, Policy, QuantSpec


@pytest.mark.parametrize("compression", ["lz4", "entropy", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.int64, torch.int8, torch.uint8, torch.bool,
                                   torch.complex64])
def test_zarr_reads_arrays(tmp_path, dtype, compression):
    store = ckptstore.open(tmp_path / "s", options=EncodingOptions(
        compression=compression, chunk_bytes=64 * 1024))
    t = (torch.randn(7001, 13) * 100).to(dtype) if dtype != torch.bool else \
        torch.rand(7001, 13) > 0.5
    info = store.commit({"t": t})
    arr = zarr.open_array(str(tmp_path / "s" / "data" / info.id / "t"), mode="r")
    assert arr.nchunks > 1
    got = arr[:]
    expect = t.view(torch.uint16).numpy() if dtype == torch.bfloat16 else t.numpy()
    assert got.dtype == expect.dtype and np.array_equal(got, expect)
    assert arr.attrs["ckptstore"]["torch_dtype"] == str(dtype).removeprefix("torch.")


def test_zarr_checks_our_checksums(tmp_path):
    store = ckptstore.open(tmp_path / "s")
    info = store.commit({"t": torch.randn(100_000)})
    chunk = tmp_path / "s" / "data" / info.id / "t" / "c" / "0"
    data = bytearray(chunk.read_bytes())
    data[100] ^= 1
    chunk.write_bytes(bytes(data))
    with pytest.raises(Exception, match="(?i)checksum"):
        zarr.open_array(str(tmp_path / "s" / "data" / info.id / "t"), mode="r")[:]


def test_packed_bytes_match_manifest_offsets(tmp_path):
    """docs/format.md: a small tensor is ``packed[offset:offset+nbytes]`` viewed as its dtype."""
    store = ckptstore.open(tmp_path / "s")
    state = {"a": torch.arange(10, dtype=torch.int32), "b": torch.randn(3, 3)}
    info = store.commit(state)
    packed = zarr.open_array(str(tmp_path / "s" / "data" / info.id / "_packed"), mode="r")[:]
    for entry in store.manifest(info.id).tensors:
        raw = packed[entry.offset: entry.offset + entry.nbytes]
        expect = state[entry.path].numpy()
        assert np.array_equal(raw.view(expect.dtype).reshape(entry.shape), expect)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64,
                                   torch.int32, torch.complex128, torch.bool])
def test_entropy_encoding_checks_out_bit_exact(tmp_path, dtype):
    store = ckptstore.open(tmp_path / "s", options=EncodingOptions(
        compression="entropy", chunk_bytes=64 * 1024))
    t = (torch.randn(5003, 17) * 10).to(dtype) if dtype != torch.bool else \
        torch.rand(5003, 17) > 0.5
    state = {"t": t, "small": torch.arange(7, dtype=torch.int16)}
    info = store.commit(state)
    entry = next(e for e in store.manifest(info.id).tensors if e.path == "t")
    assert entry.codec["id"] == "planes"
    got = store.checkout(info.id)
    assert got["t"].dtype == dtype and torch.equal(got["t"].view(torch.uint8),
                                                   t.view(torch.uint8))
    assert torch.equal(got["small"], state["small"])
    assert store.verify(info.id).ok


def _code_delta_commit(tmp_path):
    """A store whose second commit stores ``w`` as code deltas against the first's codes."""
    store = ckptstore.open(tmp_path / "s", options=EncodingOptions(chunk_bytes=16 * 1024))
    policy = Policy(quantize=QuantSpec(bits=4), delta=True, min_quant_bytes=1)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(256, 64, generator=g)
    store.commit({"w": w}, policy=policy)
    info = store.commit({"w": w + 0.01 * torch.randn(256, 64, generator=g)}, policy=policy)
    codes = store.manifest(info.id).tensors[0].parts["codes"]
    return store, info, codes


def test_code_delta_arrays_open_in_plain_zarr(tmp_path):
    # their zarr.json names the ckpt.qdelta codec: plain zarr lists the commit's group without a
    # warning and opens the array; its values decode only against the base version's codes
    # (ckptstore's checkout), so reading them with plain zarr says so
    pytest.importorskip("zarr.registry")
    _registered("ckpt.qdelta")
    store, info, codes = _code_delta_commit(tmp_path)
    folder = str(tmp_path / "s" / "data" / info.id)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Object at w.codes is not recognized" before
        assert set(zarr.open_group(folder, mode="r").array_keys()) == {codes.array}
    arr = zarr.open_array(f"{folder}/{codes.array}", mode="r")
    assert list(arr.shape) == codes.shape and arr.dtype == np.dtype(codes.dtype)
    assert arr.attrs["ckptstore"] == {"torch_dtype": "float32", "path": "w", "part": "codes"}
    with pytest.raises(CodecError, match="base version's codes"):
        arr[:]
    assert store.verify().ok


def test_verify_compares_a_code_delta_arrays_zarr_json(tmp_path):
    store, info, codes = _code_delta_commit(tmp_path)
    meta = tmp_path / "s" / "data" / info.id / codes.array / "zarr.json"
    meta.write_bytes(meta.read_bytes().replace(b'"part": "codes"', b'"part": "other"'))
    report = store.verify()
    assert not report.ok and "zarr.json" in report.problems[0]
    meta.unlink()  # commits written before their zarr.json existed verify clean
    assert store.verify().ok


def _registered(name: str) -> None:
    """The zarr codec ``name`` as the ``zarr.codecs`` entry point declares it (pyproject.toml);
    registered here when the installed metadata predates the entry point (an editable install
    made before it: ``pip install -e .`` refreshes it)."""
    from importlib.metadata import entry_points

    from zarr.registry import register_codec

    declared = (pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'"{name}" = "ckptcodecs.zarr3:' in declared
    if not [e for e in entry_points(group="zarr.codecs") if e.name == name]:
        from ckptcodecs import zarr3

        register_codec(name, zarr3.CodeDeltaCodec)
