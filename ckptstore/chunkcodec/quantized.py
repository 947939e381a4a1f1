"""Lossy chunk codecs: quantized chunks (``"quantize"``, readable by plain zarr through the
registered ``ckpt.*`` codecs) and code deltas against a base version (``"qdelta"``, ckptstore
only). The formats are ckptcodecs'; here they gain the crc32c and errors naming the chunk.

ckptcodecs is imported on first use, not with ckptstore.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import CorruptedChunkError, ManifestError
from ..limits import memory_bound
from .base import Buffer, ChunkCodec, Encoded, add_crc, check_crc
from .registry import register_chunk_codec

if TYPE_CHECKING:
    from ckptcodecs import QuantParams

__all__ = ["DEFAULT_MIN_SAVING", "CodeDelta", "QuantizedLossy"]

#: the least share of a quantized chunk's size RLE + Huffman coding must save to be done
DEFAULT_MIN_SAVING = 0.08


@register_chunk_codec
class QuantizedLossy(ChunkCodec):
    """Quantize (ckptcodecs) -> optional RLE+Huffman -> crc32c: lossy, 4-16x smaller floats.

    Registered zarr codecs (``ckpt.quantize``, ``ckpt.rle_huffman``) make the chunks readable by
    plain zarr after ``pip install ckptstore``.

    Parameters
    ----------
    quantize : dict
        Keyword arguments of :class:`ckptcodecs.Quantize` (validated here).
    entropy : bool
        RLE + Huffman code the quantized chunk.
    min_saving : float
        With ``entropy``, a chunk whose sample says coding would save less than this share of
        its size is stored raw in the RLEHuffman layout (its mode 0: the same readers), as
        zstd stores literals raw below a minimum gain. Coding costs a core a few nanoseconds a
        byte -- most of an 8-bit persist's CPU -- and saves 2-7 % on 8-bit and 2-4-bit row
        codes of dense weights. An encoder setting: not part of the stored configuration.
    prune_zeros : bool
        Exact zeros get the prune code (and decode to exact zeros); ``quantize["prune"]`` is then
        set per chunk to the chunk's share of zeros. For sparse tensors: pruned residuals and
        moments (:class:`ckptstore.policy.Shrink`).
    """

    codec_id = "quantize"
    prune_zeros: bool = False  # recorded in the config only when set (older configs unchanged)

    def __init__(self, quantize: Mapping[str, Any], entropy: bool = True,
                 prune_zeros: bool = False, min_saving: float = DEFAULT_MIN_SAVING):
        from ckptcodecs import Quantize

        if not isinstance(quantize, Mapping):
            raise TypeError(f"quantize must be a dict of Quantize parameters, not {quantize!r}")
        if not 0.0 <= min_saving < 1.0:
            raise ValueError(f"min_saving must be in [0, 1), not {min_saving!r}")
        self.quantize = dict(quantize)
        self.entropy = bool(entropy)
        self._min_saving = float(min_saving)
        if prune_zeros:
            self.prune_zeros = True
        self._codec = Quantize(**self.quantize)  # validates early

    def zarr_codecs(self, itemsize: int) -> list[dict[str, Any]]:
        chain: list[dict[str, Any]] = [{"name": "ckpt.quantize",
                                        "configuration": self._codec.get_config() | {}}]
        chain[0]["configuration"].pop("id", None)
        if self.entropy:
            chain.append({"name": "ckpt.rle_huffman", "configuration": {}})
        return chain + [{"name": "crc32c"}]

    def quantize_chunk(self, chunk: np.ndarray, score: np.ndarray | None = None
                       ) -> tuple[np.ndarray, QuantParams]:
        """``(codes, params)`` of one chunk (its bits as stored: bfloat16 as uint16)."""
        from ckptcodecs import quantize

        kw = dict(self.quantize)
        if score is not None and not self.prune_zeros:  # prune_zeros ranks by the zeros
            kw["score"] = score
        x = np.ascontiguousarray(chunk)
        if self.prune_zeros:
            zeros = x.size - np.count_nonzero(x)
            # ``prune`` is a fraction of the values: the ``zeros`` smallest magnitudes are the zeros
            kw["prune"] = (zeros - 0.5) / x.size if zeros else 0.0
        return quantize(x, kw.pop("method"), kw.pop("bits"), **kw)

    def encode_codes(self, chunk: np.ndarray, score: np.ndarray | None = None
                     ) -> tuple[Encoded, np.ndarray, QuantParams]:
        """``(stored bytes, codes, params)`` of one chunk; ``score`` ranks its values for
        protect and prune (see :func:`ckptcodecs.quantize`)."""
        codes, params = self.quantize_chunk(chunk, score)
        return self.pack(codes, params), codes, params

    def pack(self, codes: np.ndarray | None, params: QuantParams,
             packed: np.ndarray | None = None) -> Encoded:
        """Stored bytes of a chunk's ``codes`` and ``params`` (computed on the host or, by
        :mod:`ckptstore.device.quant`, on the tensor's device); ``packed``: the codes already
        bit-packed, in place of ``codes``."""
        from ckptcodecs import encode_chunk, rle_huffman_encode

        body = encode_chunk(codes, params, packed)
        return add_crc(rle_huffman_encode(body, self._min_saving) if self.entropy else body)

    def encode(self, chunk: np.ndarray) -> Encoded:
        if not self.prune_zeros:  # the same bytes as the steps below, releasing the GIL once
            data = self._codec.encode_one_call(chunk, entropy=self.entropy,
                                               min_saving=self._min_saving)
            if data is not None:
                return add_crc(data)
        return self.encode_codes(chunk)[0]

    def decode_codes(self, data: Buffer, where: str) -> tuple[np.ndarray, QuantParams]:
        """``(codes, params)`` of a stored chunk."""
        from ckptcodecs import decode_chunk

        return self._parse(data, where, decode_chunk)

    def decode_packed(self, data: Buffer, where: str) -> tuple[np.ndarray, QuantParams]:
        """``(packed codes, params)`` of a stored chunk, the codes left packed and unchecked
        (see :func:`ckptcodecs.decode_chunk_packed`): for a device that unpacks them."""
        from ckptcodecs import decode_chunk_packed

        return self._parse(data, where, decode_chunk_packed)

    def _parse(self, data: Buffer, where: str,
               parse: Callable[[np.ndarray], tuple[np.ndarray, QuantParams]]
               ) -> tuple[np.ndarray, QuantParams]:
        from ckptcodecs import rle_huffman_decode

        body = check_crc(data, where)
        try:
            with memory_bound(f"chunk {where}"):
                raw = rle_huffman_decode(body) if self.entropy else np.frombuffer(body, np.uint8)
                return parse(raw)
        except ValueError as e:  # ckptcodecs.CodecError
            raise CorruptedChunkError(f"chunk {where} does not decode: {e}", where) from e

    def decode(self, data: Buffer, out: np.ndarray, where: str) -> None:
        from ckptcodecs import dequantize

        codes, params = self.decode_codes(data, where)
        if params.count != out.size:
            raise CorruptedChunkError(
                f"chunk {where} holds {params.count} values, expected {out.size}", where)
        values = dequantize(codes, params)
        out.reshape(-1)[...] = values.view(out.dtype) if values.dtype.itemsize == \
            out.dtype.itemsize and values.dtype != out.dtype else values

    def encode_delta(self, chunk: np.ndarray, base_codes: np.ndarray, base_params: QuantParams,
                     score: np.ndarray | None = None) -> tuple[Encoded, np.ndarray, QuantParams]:
        """``(stored bytes, codes, params)`` of one chunk stored as code deltas against the codes
        of the same chunk in the previous version (DynaQuant; :mod:`ckptcodecs.qdelta`). The
        stored array's codec is :class:`CodeDelta`."""
        codes, params = self.quantize_chunk(chunk, score)
        return self.pack_delta(codes, params, base_codes, base_params), codes, params

    @staticmethod
    def pack_delta(codes: np.ndarray, params: QuantParams, base_codes: np.ndarray,
                   base_params: QuantParams) -> Encoded:
        """Stored bytes of a chunk's codes as code deltas against its base version's."""
        from ckptcodecs import qdelta_encode

        return add_crc(qdelta_encode(codes, params, base_codes, base_params))

    def decode_delta(self, data: Buffer, base_codes: np.ndarray, base_params: QuantParams,
                     where: str) -> tuple[np.ndarray, QuantParams]:
        """``(codes, params)`` of a chunk stored by :meth:`encode_delta`."""
        from ckptcodecs import qdelta_decode

        body = check_crc(data, where)
        try:
            with memory_bound(f"chunk {where}"):
                return qdelta_decode(body, base_codes, base_params)
        except ValueError as e:  # ckptcodecs.CodecError
            raise CorruptedChunkError(f"chunk {where} does not decode: {e}", where) from e


@register_chunk_codec
class CodeDelta(ChunkCodec):
    """The codec id of code-delta arrays (``{"id": "qdelta"}``): chunks written by
    :meth:`QuantizedLossy.encode_delta`, which decode only against the base version's codes
    (:meth:`QuantizedLossy.decode_delta`), never on their own. Their ``zarr.json`` names the
    ``ckpt.qdelta`` serializer (:class:`ckptcodecs.zarr3.CodeDeltaCodec`): plain zarr opens the
    array, and reading its values says to read them with ckptstore."""

    codec_id = "qdelta"
    standalone = False

    def zarr_codecs(self, itemsize: int) -> list[dict[str, Any]]:
        return [{"name": "ckpt.qdelta", "configuration": {}}, {"name": "crc32c"}]

    def encode(self, chunk: np.ndarray) -> Encoded:
        raise TypeError("code deltas need the base version's codes: use "
                        "QuantizedLossy.encode_delta")

    def decode(self, data: Buffer, out: np.ndarray, where: str) -> None:
        raise ManifestError(f"chunk {where} is a code delta: it decodes only against its base "
                            "version's codes, not as an array of its own")
