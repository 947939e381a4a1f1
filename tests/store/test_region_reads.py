"""Blocks of stored arrays read chunk by chunk straight into their destination (what a resharded
``dcp.load`` asks for: a column slice of every stored shard): every chunk codec's
``decode_region`` equals the block of its whole decode, and ``start_read_region`` fills a block
of any rows and columns exactly, for every lossless encoding and a quantized one."""

from __future__ import annotations

import numpy as np
import pytest

import ckptstore
from ckptstore.format.arrays import start_read_region
from ckptstore.chains.walk import entry_array
from ckptstore.chunkcodec import (BloscLossless, PlanesLossless, QuantizedLossy, RawLossless,
                                  codec_from_config)
from ckptstore.errors import CorruptedChunkError
from ckptstore.commit.plan import EncodingOptions
from ckptstore.policy import Policy, QuantSpec

RNG = np.random.default_rng(3)
CODECS = [BloscLossless(), PlanesLossless(), RawLossless(),
          QuantizedLossy({"method": "uniform-asymmetric", "bits": 4}, entropy=True)]


@pytest.mark.parametrize("codec,dtype", [
    (c, d) for c in CODECS for d in (np.float32, np.float16, np.float64, np.complex128)
    if not (isinstance(c, QuantizedLossy) and d is np.complex128)])  # quantizers: real floats
def test_decode_region_equals_the_block_of_the_whole_chunk(codec, dtype):
    chunk = RNG.standard_normal((64, 12, 3)).astype(dtype)
    data = b"".join(codec.encode(chunk))
    whole = codec.decoded(data, chunk.shape, chunk.dtype, "a/0.0.0")
    target = np.zeros((70, 9, 3), dtype)
    dest = target[3:43, 2:7]  # a block of rows of another pitch
    codec.decode_region(data, chunk.shape, chunk.dtype, "a/0.0.0", (10, 50), (4, 9), dest)
    np.testing.assert_array_equal(dest, whole[10:50, 4:9])
    assert not target[:3].any() and not target[43:].any() and not target[:, :2].any()
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0x10
    with pytest.raises(CorruptedChunkError, match="a/0.0.0"):
        codec.decode_region(bytes(bad), chunk.shape, chunk.dtype, "a/0.0.0", (0, 5), (0, 12),
                            np.empty((5, 12, 3), dtype))


@pytest.mark.parametrize("compression", ["entropy", "lz4", "none", "4-bit"])
@pytest.mark.parametrize("block", [((0, 0), (500, 16)), ((37, 5), (400, 6)), ((499, 15), (1, 1)),
                                   ((100, 0), (350, 16))], ids=str)
def test_blocks_read_straight_into_place(tmp_path, compression, block):
    opts = EncodingOptions(chunk_bytes=4096, pack_below=0,
                           compression="entropy" if compression == "4-bit" else compression)
    policy = Policy(quantize=QuantSpec(bits=4)) if compression == "4-bit" else None
    x = RNG.standard_normal((500, 16)).astype(np.float32)
    store = ckptstore.open(tmp_path / "s", options=opts)
    store.commit({"t": x}, policy=policy)
    whole = np.asarray(store.checkout("main")["t"])
    a = entry_array(store.manifest(store.resolve("main")).tensors[0])
    offsets, lengths = block
    want = whole[offsets[0]:offsets[0] + lengths[0], offsets[1]:offsets[1] + lengths[1]]
    into = np.full(lengths, np.nan, np.float32)
    puts: list[int] = []

    def put(row: int, part: np.ndarray) -> None:
        puts.append(row)
        into[row:row + part.shape[0]] = part

    for f in start_read_region(store.repo.storage, a.prefix, a.grid, a.dtype,
                               codec_from_config(a.codec), store.repo.executor, offsets, lengths,
                               put, into=into):
        f.result()
    np.testing.assert_array_equal(into, want)
    assert not puts  # every chunk went straight into place
    store.close()


def test_a_payload_of_other_items_is_a_corrupted_chunk():
    """A byte-planes chunk of 2-byte items where the manifest says 4-byte ones (its item count
    matching) is refused as corrupted, never decoded into the wrong dtype."""
    codec = PlanesLossless()
    data = b"".join(codec.encode(RNG.standard_normal((8, 4)).astype(np.float16)))
    with pytest.raises(CorruptedChunkError, match="2-byte items"):
        codec.decode_region(data, (8, 4), np.dtype(np.float32), "a/0.0", (0, 8), (0, 2),
                            np.empty((8, 2), np.float32))
