"""Residual chains (format 4, ExCP, :class:`~ckptstore.policy.Shrink`): a ``residual`` entry
stores a pruned, k-means quantized residual against the previous commit's rebuilt values (part
``residual``); a checkout adds the chain onto a lossless baseline."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ...chunkcodec import LOSSLESS_IDS, ChunkCodec, Encoded, QuantizedLossy
from ...errors import ManifestError
from ...format.dtypes import numpy_dtype
from ...format.floatbits import add_residual
from ...format.grid import ChunkGrid
from ...history.manifest import Kind, Manifest, TensorEntry
from ..links import ChainLink, ChainStart, Reference, Shadow
from ..replay import ReadBlocks, block_rows, writable
from .base import ChainKind, ChainSource, Kept, LinkItem, LinkSink, LinkWritten, Remembered, \
    StagedLink, fits, host_copy, misfit
from .registry import register_chain_kind

if TYPE_CHECKING:  # hints only: policy imports the walk, the walk these kinds
    from ...policy import Policy, Want

__all__ = ["Residual", "apply_residuals"]


@register_chain_kind
class Residual(ChainKind):
    """A quantized residual on the values a checkout of the previous commit rebuilds."""

    kinds: ClassVar[tuple[Kind, ...]] = (Kind.RESIDUAL,)
    want: ClassVar[Want] = "residual"
    parts: ClassVar[tuple[frozenset[str], ...]] = (frozenset({"residual"}),)

    def link(self, policy: Policy, quantized: bool, tip: Manifest, prev: TensorEntry,
             ref: Reference | None, tracked: bool, rebase: bool) -> ChainLink | None:
        if prev.kind not in (Kind.FULL, Kind.RESIDUAL) or prev.chain + 1 > policy.max_chain:
            return None
        if prev.kind == Kind.FULL and (prev.codec or {}).get("id") not in LOSSLESS_IDS:
            return None
        if ref is None or ref.commit != tip.id or not ref.has_values:
            return None
        return ChainLink(Kind.RESIDUAL, tip.id, prev.chain + 1)

    def baseline_codec(self, codec: ChunkCodec | None) -> ChunkCodec | None:
        return None  # a residual chain's baseline is lossless

    def start(self, link: ChainLink, shadow: Shadow, tracked: bool,
              grid: ChunkGrid) -> ChainStart | None:
        return ChainStart(link, reference=shadow.values)

    def write(self, item: LinkItem, staged: StagedLink, sink: LinkSink) -> LinkWritten:
        """Quantize the pruned residual (the snapshot holds it) chunk by chunk; rebuild
        ``reference + dequantized`` as a checkout will (the next residual's reference)."""
        from ckptcodecs import dequantize

        residual, reference, codec = staged.staged, item.start.reference, item.codec
        assert reference is not None and reference.shape == residual.shape
        assert isinstance(codec, QuantizedLossy) and residual.dtype == reference.dtype
        rebuilt = np.empty_like(reference)

        def encode(i: int, chunk: np.ndarray) -> Encoded:
            data, codes, params = codec.encode_codes(chunk)
            lo, hi = item.grid.rows(i)
            n = reference[lo:hi].size
            values = dequantize(codes, params).reshape(-1)[:n].reshape(reference[lo:hi].shape)
            # in the tensor's dtype, as a checkout decodes them; added as it adds them
            add_residual(reference[lo:hi], values, item.dtype, out=rebuilt[lo:hi])
            return data

        sink.array("residual", residual, item.grid, codec, encode)
        return LinkWritten(1.0, rebuilt=rebuilt)

    def remember(self, item: Remembered, commit_id: str, kept: Kept,
                 old: Shadow | None) -> Shadow | None:
        # the next residual is taken against what checkout rebuilds
        values = kept.rebuilt if item.kind == Kind.RESIDUAL else (
            host_copy(kept.host, old) if item.codec.codec_id in LOSSLESS_IDS else None)
        if values is None:
            return None
        return Shadow(commit_id, values=values, exact=item.kind == Kind.FULL)

    def check(self, e: TensorEntry, base: TensorEntry, link: TensorEntry) -> None:
        from ...policy.shrink import SHRINKABLE  # policy imports the walk, the walk the kinds

        r = link.parts["residual"]
        if not (fits(r, e.shape) and link.dtype in SHRINKABLE
                and np.dtype(r.dtype) == numpy_dtype(base.dtype)):
            raise misfit(f"a chain link of {e.path!r}", r.commit)

    def replay(self, chain: list[TensorEntry], source: ChainSource,
               out: np.ndarray | None = None) -> np.ndarray:
        return apply_residuals(source.host(chain[0], out), chain[1:], source.blocks)


def apply_residuals(out: np.ndarray, links: list[TensorEntry], read_blocks: ReadBlocks
                    ) -> np.ndarray:
    """Add the dequantized residual of each link, oldest first, onto the baseline ``out`` (in
    place where it is writable; in its dtype, in the order the writer added them: the same
    values, bit for bit; 16-bit floats through float32, see
    :func:`~ckptstore.format.floatbits.add_residual`), a chunk of the stored residual at a time."""
    from ...policy.shrink import SHRINKABLE  # policy imports the walk, the walk the kinds

    out = writable(out, links)
    for link in links:
        r = (link.parts or {}).get("residual")
        if link.kind != Kind.RESIDUAL or r is None:
            raise ManifestError(f"residual chain of {link.path!r} mixes kinds")
        if tuple(r.shape) != out.shape or np.dtype(r.dtype) != out.dtype or (
                link.dtype not in SHRINKABLE):
            raise misfit(f"residual of {link.path!r}", r.commit)

        def add(row: int, part: np.ndarray, dtype: str = link.dtype) -> None:
            rows = block_rows(out, row, part)
            add_residual(rows, part, dtype, out=rows)

        read_blocks(r, add)
    return out
