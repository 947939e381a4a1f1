"""Plain zarr (no ckptstore code) reads every array of a full commit, checksums included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zarr

import ckptstore
from ckptstore import EncodingOptions


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
