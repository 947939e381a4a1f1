"""ckptcodecs: compression codecs for checkpoints (installed from the ``codecs/`` folder).

Depends on numpy, numcodecs and zarr only -- never on ``ckptstore`` -- plus its compiled kernels
(``ckptcodecs._native``); numba, optional, runs their reference twins.

- :class:`Quantize` (``ckpt.quantize``): lossy float -> packed 1..8-bit codes; functional core
  :func:`quantize` / :func:`dequantize` with :class:`QuantParams`.
- :func:`delta_encode` / :func:`delta_decode` (:class:`BucketDelta`): cyclic code deltas against
  a base version, rearranged by base bucket.
- :class:`RLEHuffman` (``ckpt.rle_huffman``): lossless run lengths + canonical Huffman.
- :class:`BytePlanes` (``ckpt.byte_planes``): lossless byte planes of numbers, each plane
  block-adaptive Huffman, zstd or raw (:func:`planes_encode` / :func:`planes_decode`;
  :func:`planes_decode_region` puts together a block of rows and columns only).
- :func:`encode_chunk` / :func:`decode_chunk`: the self-contained Quantize chunk layout for codes
  and parameters computed elsewhere (e.g. codes rebuilt from a BucketDelta).
- :func:`encode_uniform_chunk`: a uniform or adaptive-asymmetric Quantize chunk (RLEHuffman
  coded or not) in one compiled call, or None where :func:`quantize`'s special cases need its
  own steps.
- :func:`qdelta_encode` / :func:`qdelta_decode`: DynaQuant code-delta chunks (new parameters +
  RLE+Huffman coded BucketDelta of the codes against a base version's codes).
- :func:`pack_bits` / :func:`unpack_bits` / :func:`packed_size`: the dense bit packing of codes.
- :class:`CodecError` (a ``ValueError``), :class:`CodecTypeError` (also a ``TypeError``).
- Constants: ``METHODS``, ``GRANULARITIES``, ``PROTECT_MODES``, ``PARAM_DTYPES`` (the values
  :class:`Quantize` accepts for ``method``, ``granularity``, ``protect_mode``, ``param_dtype``);
  ``HEADER_SIZE`` (bytes of a Quantize chunk's version-1 header).

Public modules, besides the names above (``__all__``):

- :mod:`ckptcodecs.floats`: casts on bits (bfloat16 as uint16, float16) and the 16-bit residual
  sum rounded once.
- :mod:`ckptcodecs.kernels`: the steps of :func:`quantize` another implementation of it (a GPU's)
  leaves to the host to reproduce its codes bit for bit, and the constants it must agree on.
- :mod:`ckptcodecs.zarr3`: ``QuantizeCodec``, ``RLEHuffmanCodec``, ``BytePlanesCodec`` and
  ``CodeDeltaCodec`` for zarr v3 (imported lazily).

Everything else is implementation and may change: the underscore modules (the compiled kernels)
and the algorithm modules (``quantization``, ``qparams``, ``adaptive``, ``kmeans``, ...). The
codec classes' modules stay importable under the names the entry points give.

Importing the package registers the numcodecs codecs (the ``numcodecs.codecs`` entry points do
the same for processes that never import it).
"""

from numcodecs.registry import register_codec

from . import floats, kernels
from ._qformat import HEADER_SIZE, decode_chunk, decode_chunk_packed, encode_chunk
from .bitpack import pack_bits, packed_size, unpack_bits
from .planes import BytePlanes, planes_decode, planes_decode_region, planes_encode
from .delta import BucketDelta, delta_decode, delta_encode
from .errors import CodecError, CodecTypeError
from .qdelta import qdelta_decode, qdelta_encode
from .quantize import (  # the function quantize, bound after the submodule it shadows
    GRANULARITIES,
    METHODS,
    PARAM_DTYPES,
    PROTECT_MODES,
    Quantize,
    QuantParams,
    dequantize,
    quantize,
)
from .rle_huffman import RLEHuffman, rle_huffman_decode, rle_huffman_encode
from .uniform_chunk import encode_uniform_chunk

__all__ = [
    "GRANULARITIES",
    "HEADER_SIZE",
    "METHODS",
    "PARAM_DTYPES",
    "PROTECT_MODES",
    "BucketDelta",
    "BytePlanes",
    "CodecError",
    "CodecTypeError",
    "QuantParams",
    "Quantize",
    "RLEHuffman",
    "decode_chunk",
    "decode_chunk_packed",
    "delta_decode",
    "delta_encode",
    "dequantize",
    "encode_chunk",
    "encode_uniform_chunk",
    "pack_bits",
    "packed_size",
    "planes_decode",
    "planes_decode_region",
    "planes_encode",
    "qdelta_decode",
    "qdelta_encode",
    "quantize",
    "rle_huffman_decode",
    "rle_huffman_encode",
    "unpack_bits",
]

register_codec(Quantize)
register_codec(RLEHuffman)
register_codec(BytePlanes)
