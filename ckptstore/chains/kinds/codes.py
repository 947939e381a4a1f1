"""Code-delta chains (DynaQuant section 6): a ``delta`` entry stores the quantization codes of a
dense tensor as cyclic deltas against the previous commit's codes, rearranged by base bucket
(part ``codes``); a checkout replays the code deltas chunk by chunk, then dequantizes once."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, wait
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ...chunkcodec import CodeDelta, Encoded, QuantizedLossy, codec_from_config
from ...errors import CorruptedChunkError, ManifestError
from ...format.dtypes import numpy_dtype
from ...format.grid import ChunkGrid
from ...format.layout import array_dir, chunk_key
from ...history.manifest import Kind, Layout, Manifest, TensorEntry
from ...limits import allocate
from ...storage import Buffer
from ..links import ChainLink, ChainStart, CodesBase, Reference, Shadow
from ..replay import ChunkCodesOf
from .base import ChainKind, ChainSource, Kept, LinkItem, LinkSink, LinkWritten, Remembered, \
    StagedLink
from .registry import register_chain_kind

if TYPE_CHECKING:
    from ...policy import Policy, Want
    from ckptcodecs import QuantParams

__all__ = ["Codes", "chain_codes", "replay_code_deltas"]


@register_chain_kind
class Codes(ChainKind):
    """Quantization codes as deltas against the previous commit's (kept by the store)."""

    kinds: ClassVar[tuple[Kind, ...]] = (Kind.DELTA,)
    want: ClassVar[Want] = "codes"
    parts: ClassVar[tuple[frozenset[str], ...]] = (frozenset({"codes"}),)
    own_array: ClassVar[bool] = False

    def link(self, policy: Policy, quantized: bool, tip: Manifest, prev: TensorEntry,
             ref: Reference | None, tracked: bool, rebase: bool) -> ChainLink | None:
        if not quantized or prev.kind not in (Kind.FULL, Kind.DELTA) or (
                prev.chain + 1 > policy.max_chain):
            return None
        if prev.codec is None and prev.kind == Kind.FULL:
            return None
        if ref is None or ref.commit != tip.id or not ref.has_codes:
            return None
        return ChainLink(Kind.DELTA, tip.id, prev.chain + 1)

    def start(self, link: ChainLink, shadow: Shadow, tracked: bool,
              grid: ChunkGrid) -> ChainStart | None:
        if shadow.grid_chunks != tuple(grid.chunks):
            return None
        return ChainStart(link, base_codes=shadow.codes)

    def write(self, item: LinkItem, staged: StagedLink, sink: LinkSink) -> LinkWritten:
        base, codec = item.start.base_codes, item.codec
        assert isinstance(codec, QuantizedLossy) and base is not None
        codes: CodesBase = {}
        quantized = sink.quantized()

        def encoded(i: int, lo: int, hi: int) -> Encoded:
            new_codes, params = quantized(i, lo, hi)
            codes[i] = (new_codes, params)
            return codec.pack_delta(new_codes, params, *base[i])

        sink.chunks("codes", item.grid, sink.host_dtype, CodeDelta(), encoded)
        return LinkWritten(1.0, codes=codes)

    def remember(self, item: Remembered, commit_id: str, kept: Kept,
                 old: Shadow | None) -> Shadow | None:
        if not kept.codes:
            return None
        return Shadow(commit_id, codes=kept.codes, grid_chunks=tuple(item.grid.chunks))

    def check(self, e: TensorEntry, base: TensorEntry, link: TensorEntry) -> None:
        codec = codec_from_config(base.codec) if base.layout == Layout.ARRAY else None
        if not isinstance(codec, QuantizedLossy):
            raise ManifestError(f"code deltas of {e.path!r} need a quantized full baseline")
        if link.chunks != base.chunks:
            raise ManifestError(f"delta chain of {e.path!r} mixes chunk grids")

    def replay(self, chain: list[TensorEntry], source: ChainSource,
               out: np.ndarray | None = None) -> np.ndarray:
        return replay_code_deltas(chain, numpy_dtype(chain[0].dtype), source.read,
                                  source.executor, out)

    def device_codes(self, chain: list[TensorEntry], read: Callable[[str], Buffer]
                     ) -> tuple[ChunkGrid, ChunkCodesOf] | None:
        _, grid, codes_of = chain_codes(chain, read)
        return grid, codes_of


def chain_codes(chain: list[TensorEntry], read: Callable[[str], Buffer]
                ) -> tuple[QuantizedLossy, ChunkGrid, ChunkCodesOf]:
    """``(codec, grid, codes_of)`` of a quantized full baseline and its code deltas:
    ``codes_of(chunk key) -> (codes, params, where)`` rebuilds one chunk's codes of the last
    version from the baseline's, delta by delta."""
    base = chain[0]
    codec = codec_from_config(base.codec)
    if base.layout != Layout.ARRAY or not isinstance(codec, QuantizedLossy):
        raise ManifestError(f"code deltas of {base.path!r} need a quantized full baseline")
    grid = ChunkGrid.checked(base.shape, base.chunks)
    for d in chain[1:]:
        if d.kind != Kind.DELTA or list(grid.chunks) != d.chunks:
            raise ManifestError(f"delta chain of {base.path!r} mixes kinds or chunk grids")

    def codes_of(key: str) -> tuple[np.ndarray, QuantParams, str]:
        where = chunk_key(array_dir(base.commit, base.array), key)
        codes, params = codec.decode_codes(read(where), where)
        for d in chain[1:]:
            blob = d.parts["codes"]
            where = chunk_key(array_dir(blob.commit, blob.array), key)
            codes, params = codec.decode_delta(read(where), codes, params, where)
        return codes, params, where

    return codec, grid, codes_of


def replay_code_deltas(chain: list[TensorEntry], dtype: np.dtype, read: Callable[[str], Buffer],
                       executor: Executor, out: np.ndarray | None = None) -> np.ndarray:
    """Rebuild a tensor from a quantized full baseline and its code deltas, chunk by chunk in
    parallel: codes of each version from the previous one's, then one dequantization (into
    ``out``, an array of the baseline's shape and ``dtype``, where given)."""
    from ckptcodecs import dequantize

    _, grid, codes_of = chain_codes(chain, read)
    if out is None:
        out = allocate(tuple(chain[0].shape), dtype, f"the code deltas of {chain[0].path!r}")
    elif out.shape != tuple(chain[0].shape) or out.dtype != dtype:
        raise ManifestError(f"code deltas of {chain[0].path!r} do not fit the tensor")

    def one(key: str, lo: int, hi: int) -> None:
        codes, params, where = codes_of(key)
        values = dequantize(codes, params)
        full = values.view(dtype) if values.dtype != dtype else values
        if full.size != int(np.prod(grid.chunks)):
            raise CorruptedChunkError(f"chunk {where} has the wrong size", where)
        out[lo:hi] = full.reshape(grid.chunks)[: hi - lo]

    futures = [executor.submit(one, key, lo, hi) for _, key, lo, hi in grid]
    wait(futures)  # none still writes into ``out`` when an error is raised
    for f in futures:
        f.result()
    return out
