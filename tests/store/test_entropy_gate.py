"""Quantized chunks are RLE + Huffman coded only where a sample says it saves at least
``QuantSpec.entropy_min_saving`` of their size; elsewhere the codes are stored raw in the same
layout, which ckptstore and plain zarr read as before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from ckptcodecs import dequantize, quantize

import ckptstore
from ckptstore import EncodingOptions, Policy, QuantSpec

CRC = 4  # each chunk ends in its crc32c


def chunk_modes(root: Path, commit: str, name: str) -> set[int]:
    """The RLEHuffman modes (0 raw, 1 coded) of a quantized array's chunk files."""
    return {f.read_bytes()[1] for f in (root / "data" / commit / name).rglob("c/*/*")
            if f.is_file()}


@pytest.mark.parametrize("min_saving", [0.0, 0.08, 0.5])
def test_codes_are_coded_where_it_saves_enough(tmp_path, min_saving):
    """8-bit row codes (Huffman saves ~5 %) are stored raw at the default 0.08 and at 0.5,
    coded at 0.0; 8-bit codes of a range as wide as the chunk's (saving ~14 %) are coded
    unless 0.5 is asked; every chunk checks out as quantize/dequantize gives it, through
    ckptstore and plain zarr."""
    g = torch.Generator().manual_seed(0)
    dense = torch.randn(4096, 64, generator=g) * 0.05  # 1 MiB: four chunks of 256 KiB
    wide = torch.randn(4096, 64, generator=g)
    specs = {"dense": QuantSpec(bits=8, entropy_min_saving=min_saving),
             "wide": QuantSpec("uniform-asymmetric", bits=8, granularity="tensor",
                               entropy_min_saving=min_saving)}
    policy = Policy(quantize=specs["dense"], overrides=(("wide", specs["wide"]),))
    root = tmp_path / "s"
    with ckptstore.open(root, policy=policy,
                        options=EncodingOptions(chunk_bytes=256 * 1024)) as store:
        info = store.commit({"dense": dense, "wide": wide})
        out = store.checkout(info.id)
    assert chunk_modes(root, info.id, "dense") == {1 if min_saving == 0.0 else 0}
    assert chunk_modes(root, info.id, "wide") == {0 if min_saving == 0.5 else 1}
    for name, t in (("dense", dense), ("wide", wide)):
        kw = specs[name].codec_kwargs("float32")
        method, bits = kw.pop("method"), kw.pop("bits")
        expected = np.concatenate([  # chunk by chunk (1024 rows), as stored
            dequantize(*quantize(c.numpy(), method, bits, **kw)).reshape(c.shape)
            for c in t.split(1024)])
        np.testing.assert_array_equal(out[name].numpy(), expected)
        np.testing.assert_array_equal(
            zarr.open_array(str(root / "data" / info.id / name), mode="r")[:], expected)


def test_raw_codes_cost_what_the_saving_was(tmp_path):
    """The commit with raw 8-bit codes is larger than the coded one by at most a tenth (the
    saving it gave up was under the default 8 % a chunk)."""
    t = torch.randn(4096, 64, generator=torch.Generator().manual_seed(1)) * 0.05
    sizes = {}
    for min_saving in (0.0, 0.08):
        with ckptstore.open(tmp_path / str(min_saving), policy=Policy(
                quantize=QuantSpec(bits=8, entropy_min_saving=min_saving))) as store:
            sizes[min_saving] = store.commit({"t": t}).stored_bytes
    assert sizes[0.0] < sizes[0.08] < 1.1 * sizes[0.0]


def test_a_bad_min_saving_is_refused():
    with pytest.raises(ValueError, match="min_saving"):
        ckptstore.chunkcodec.QuantizedLossy({"method": "kmeans", "bits": 2}, min_saving=1.0)


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, float("nan"), "0.1", True])
def test_a_minimum_saving_out_of_range_is_refused_when_the_spec_is_made(bad):
    with pytest.raises(ValueError, match="entropy_min_saving"):
        QuantSpec(bits=8, entropy_min_saving=bad)
