"""How one chunk of an array becomes bytes on the store, and back.

A chunk pipeline is the zarr v3 codec chain ``bytes -> <compressor> -> crc32c``; the store writes
and reads chunks itself (pipelined, in parallel) but produces exactly the bytes zarr would, so plain
zarr reads every full commit. The manifest records each array's pipeline as a small dict
(:meth:`ChunkCodec.config`) and :func:`codec_from_config` rebuilds it, looking the class up by the
dict's ``"id"``.

========  ==================  ==================================================
id        class               module
========  ==================  ==================================================
blosc     BloscLossless       :mod:`.lossless`
raw       RawLossless         :mod:`.lossless`
planes    PlanesLossless      :mod:`.lossless`
quantize  QuantizedLossy      :mod:`.quantized`
qdelta    CodeDelta           :mod:`.quantized` (decodes only against base codes)
========  ==================  ==================================================

Adding a chunk codec
--------------------
Subclass :class:`ChunkCodec`, give it a ``codec_id`` no other codec holds, keep the constructor's
arguments as attributes of the same names (the default ``config``/``from_config`` then round-trip
it), implement ``zarr_codecs``, ``encode`` and ``decode``, and register the class::

    import numcodecs
    from ckptstore.chunkcodec import ChunkCodec, add_crc, check_crc, register_chunk_codec

    @register_chunk_codec
    class ZstdLossless(ChunkCodec):
        codec_id = "zstd"

        def __init__(self, level: int = 3):
            self.level = int(level)
            self._zstd = numcodecs.Zstd(level=self.level)

        def zarr_codecs(self, itemsize):
            return [{"name": "bytes", "configuration": {"endian": "little"}},
                    {"name": "zstd", "configuration": {"level": self.level}},
                    {"name": "crc32c"}]

        def encode(self, chunk):
            return add_crc(self._zstd.encode(chunk))

        def decode(self, data, out, where):
            self._zstd.decode(check_crc(data, where), out=out.reshape(-1).view("u1"))

``decode`` gets the stored chunk as a read-only buffer (``bytes``, or a ``memoryview`` where a
back-end hands one out); ``check_crc`` takes either and returns a memoryview of the body. Do not
rely on ``bytes`` methods, and copy what the decoded array must keep.

Reads go through :meth:`ChunkCodec.read_rows`, which by default reads the stored bytes and calls
``decode`` (or ``decode_region`` for some of the chunk's rows). A codec whose stored body is
the decoded bits themselves overrides it to read the chunk straight into the destination
(``Storage.read_chunk_into``: ``preadv`` on local disks) and checks the crc32c there
(``check_crc_parts``); ``raw`` does.

A store that records an id this ckptstore does not know fails to read with a
:class:`~ckptstore.errors.ManifestError` asking for an upgrade.

May import: storage and the top-level helpers (errors, limits, info, priority, progress, _version).
"""

from .base import (ChunkCodec, ChunkSource, Encoded, add_crc, check_crc, check_crc_parts,
                   encoded_size)
from .lossless import LOSSLESS_IDS, BloscLossless, PlanesLossless, RawLossless, lossless_codec
from .quantized import CodeDelta, QuantizedLossy
from .registry import chunk_codec_ids, codec_from_config, register_chunk_codec

__all__ = [
    "LOSSLESS_IDS",
    "BloscLossless",
    "ChunkCodec",
    "ChunkSource",
    "CodeDelta",
    "Encoded",
    "PlanesLossless",
    "QuantizedLossy",
    "RawLossless",
    "add_crc",
    "check_crc",
    "check_crc_parts",
    "chunk_codec_ids",
    "codec_from_config",
    "encoded_size",
    "lossless_codec",
    "register_chunk_codec",
]
