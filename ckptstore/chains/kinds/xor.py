"""XOR chains (format 3): an ``xor`` entry stores the bits of a lossless dense tensor XOR the
previous commit's bits, byte-plane coded (part ``xor``: the sign, exponent and high mantissa
bytes of a slowly moving tensor XOR to mostly zeros); a checkout XORs the chain onto the
baseline."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ...chunkcodec import LOSSLESS_IDS, PlanesLossless
from ...errors import ManifestError
from ...format.dtypes import numpy_dtype
from ...format.grid import ChunkGrid
from ...history.manifest import Kind, Manifest, TensorEntry
from ..links import ChainLink, ChainStart, Reference, Shadow
from ..replay import ReadBlocks, bits_of, block_rows, writable, xor_bits
from .base import ChainKind, ChainSource, Kept, LinkItem, LinkSink, LinkWritten, Remembered, \
    StagedLink, fits, host_copy, misfit
from .registry import register_chain_kind

if TYPE_CHECKING:  # hints only: policy imports the walk, the walk these kinds
    from ...policy import Policy, Want

__all__ = ["Xor", "apply_xors"]


@register_chain_kind
class Xor(ChainKind):
    """Every commit the XOR of its bits with the previous one's; every commit is the next
    one's reference."""

    kinds: ClassVar[tuple[Kind, ...]] = (Kind.XOR,)
    want: ClassVar[Want] = "xor"
    parts: ClassVar[tuple[frozenset[str], ...]] = (frozenset({"xor"}),)

    def link(self, policy: Policy, quantized: bool, tip: Manifest, prev: TensorEntry,
             ref: Reference | None, tracked: bool, rebase: bool) -> ChainLink | None:
        if quantized or prev.kind not in (Kind.FULL, Kind.XOR) or (
                prev.chain + 1 > policy.max_chain):
            return None
        if (prev.codec or {}).get("id") not in LOSSLESS_IDS:
            return None
        if ref is None or ref.commit != tip.id or not ref.has_values:
            return None
        return ChainLink(Kind.XOR, tip.id, prev.chain + 1)

    def start(self, link: ChainLink, shadow: Shadow, tracked: bool,
              grid: ChunkGrid) -> ChainStart | None:
        return ChainStart(link, reference=shadow.values)

    def write(self, item: LinkItem, staged: StagedLink, sink: LinkSink) -> LinkWritten:
        host, reference = staged.staged, item.start.reference
        assert reference is not None and reference.shape == host.shape
        sink.array("xor", xor_bits(host, reference), item.grid, PlanesLossless())
        return LinkWritten(1.0)

    def remember(self, item: Remembered, commit_id: str, kept: Kept,
                 old: Shadow | None) -> Shadow | None:
        if item.codec.codec_id not in LOSSLESS_IDS:
            return None
        return Shadow(commit_id, values=host_copy(kept.host, old), exact=True)

    def check(self, e: TensorEntry, base: TensorEntry, link: TensorEntry) -> None:
        x = link.parts["xor"]
        if not fits(x, e.shape, numpy_dtype(base.dtype).itemsize):
            raise misfit(f"a chain link of {e.path!r}", x.commit)

    def replay(self, chain: list[TensorEntry], source: ChainSource,
               out: np.ndarray | None = None) -> np.ndarray:
        return apply_xors(source.host(chain[0], out), chain[1:], source.blocks)


def apply_xors(out: np.ndarray, links: list[TensorEntry], read_blocks: ReadBlocks
               ) -> np.ndarray:
    """XOR the bits of each link, oldest first, onto the baseline ``out`` (in place where it is
    writable), a chunk of the stored XOR at a time."""
    out = writable(out, links)
    acc = bits_of(out)
    for link in links:
        x = (link.parts or {}).get("xor")
        if link.kind != Kind.XOR or x is None:
            raise ManifestError(f"xor chain of {link.path!r} mixes kinds")
        if tuple(x.shape) != out.shape or np.dtype(x.dtype).itemsize != out.dtype.itemsize:
            raise misfit(f"xor of {link.path!r}", x.commit)

        def xor(row: int, part: np.ndarray) -> None:
            rows = block_rows(acc, row, part)
            np.bitwise_xor(rows, bits_of(part), out=rows)

        read_blocks(x, xor)
    return out
