"""Row chains (Check-N-Run section 5.1): an ``incremental`` entry (one-shot, intermittent) stores
the rows changed since the baseline, a ``consecutive`` one those changed since the previous
commit (parts ``rows`` and ``values``, or ``xvalues``: the new bits XOR the old ones).

Changed rows come from a :class:`~ckptstore.tracking.rows.RowTracker` when the commit is given
one, else from comparing the tensor's bits with a copy of the reference kept after the last
commit: on the tensor's device when its snapshot was staged there (:mod:`ckptstore.device.rows`),
else in host memory. A tracked table keeps no copy unless ``Policy(delta=True)`` asks for its
lossless changed rows as the XOR of their old bits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ...chunkcodec import LOSSLESS_IDS, BloscLossless, PlanesLossless
from ...errors import ManifestError
from ...format.dtypes import numpy_dtype
from ...format.grid import ChunkGrid
from ...history.manifest import Blob, Kind, Manifest, TensorEntry
from ..links import ChainLink, ChainStart, Reference, Shadow
from ..replay import bits_of, changed_rows, writable, xor_bits
from .base import ChainKind, ChainSource, Kept, LinkItem, LinkSink, LinkWritten, Remembered, \
    StagedLink, fits, host_copy, misfit
from .registry import register_chain_kind

if TYPE_CHECKING:  # hints only: policy imports the walk, the walk these kinds
    from ...policy import Policy, Want

__all__ = ["Rows", "apply_rows"]

_ROWS_CODEC = BloscLossless()  # of the row indices


@register_chain_kind
class Rows(ChainKind):
    """Changed rows onto a baseline (``incremental``) or onto the previous commit
    (``consecutive``)."""

    kinds: ClassVar[tuple[Kind, ...]] = (Kind.INCREMENTAL, Kind.CONSECUTIVE)
    want: ClassVar[Want] = "rows"
    tracks_rows: ClassVar[bool] = True
    parts: ClassVar[tuple[frozenset[str], ...]] = (frozenset({"rows", "values"}),
                                                   frozenset({"rows", "xvalues"}))

    def rebases(self, policy: Policy, tip: Manifest) -> bool:
        """Check-N-Run decides per checkpoint: the predictor sees ``S1..Si`` of the whole
        checkpoint, each increment's size as a fraction of the rows averaged over the
        incremental tensors weighted by their bytes; chains of different lengths (a tensor that
        joined later) are aligned by rebasing."""
        if policy.incremental not in ("one-shot", "intermittent"):
            return False
        inc = [e for e in (*tip.tensors, *tip.shards) if e.kind == Kind.INCREMENTAL]
        if not inc:
            return False
        lengths = {len(e.fractions or []) for e in inc}
        if len(lengths) > 1:
            return True
        n = lengths.pop()
        if n >= policy.max_chain:
            return True
        if policy.incremental != "intermittent":
            return False
        weights = [max(e.nbytes or 0, 1) for e in inc]
        total = sum(weights)
        fractions = [sum(w * e.fractions[k] for w, e in zip(weights, inc)) / total
                     for k in range(n)]
        return policy.rebase.should_rebase(fractions)

    def link(self, policy: Policy, quantized: bool, tip: Manifest, prev: TensorEntry,
             ref: Reference | None, tracked: bool, rebase: bool) -> ChainLink | None:
        mode = policy.incremental
        if mode in ("one-shot", "intermittent"):
            baseline = tip.id if prev.kind == Kind.FULL else prev.base_commit
            if prev.kind not in (Kind.FULL, Kind.INCREMENTAL):
                return None
            fractions = tuple(prev.fractions or []) if prev.kind == Kind.INCREMENTAL else ()
            if rebase or len(fractions) >= policy.max_chain:
                return None
            if ref is None or ref.commit != baseline or (not ref.has_values and not tracked):
                return None
            return ChainLink(Kind.INCREMENTAL, baseline, len(fractions) + 1, fractions)
        if mode == "consecutive":
            if prev.kind not in (Kind.FULL, Kind.CONSECUTIVE) or prev.chain + 1 > policy.max_chain:
                return None
            if ref is None or ref.commit != tip.id or (not ref.has_values and not tracked):
                return None
            return ChainLink(Kind.CONSECUTIVE, tip.id, prev.chain + 1)
        return None

    def keeps_bits(self, policy: Policy, quantized: bool) -> bool:
        return policy.delta and not quantized

    def start(self, link: ChainLink, shadow: Shadow, tracked: bool,
              grid: ChunkGrid) -> ChainStart | None:
        mask = None
        if tracked and shadow.unsaved is not None:
            mask = shadow.unsaved.copy()
            if link.kind == Kind.INCREMENTAL and shadow.since_base is not None:
                mask |= shadow.since_base
        return ChainStart(link, tracked_rows=mask, reference=shadow.values,
                          device_reference=shadow.device_values, exact=shadow.exact)

    def write(self, item: LinkItem, staged: StagedLink, sink: LinkSink) -> LinkWritten:
        """The changed rows (a tracker's, the snapshot's when it staged only them -- then
        ``xored``: already XOR-ed with their old bits -- else compared with the reference: the
        host copy of a device one, or the host one) and their values, or the XOR of their bits
        where the old ones are at hand and exact (lossless)."""
        host, start = staged.staged, item.start
        reference = staged.reference if staged.reference is not None else start.reference
        if staged.rows is not None:
            rows, values = staged.rows, host
        else:
            rows = (np.flatnonzero(start.tracked_rows).astype(np.int64)
                    if start.tracked_rows is not None else changed_rows(host, reference))
            values = host[rows]
        part, codec = "values", item.codec
        if staged.xored:
            part, codec = "xvalues", PlanesLossless()
        elif reference is not None and start.exact and codec.codec_id in LOSSLESS_IDS:
            # lossless rows whose old values are at hand: store what changed in their bits
            values, part, codec = xor_bits(values, reference[rows]), "xvalues", PlanesLossless()
        sink.array("rows", rows, ChunkGrid.for_array(rows.shape, 8, sink.chunk_bytes),
                   _ROWS_CODEC)
        sink.array(part, values, ChunkGrid.for_array(values.shape, values.dtype.itemsize,
                                                     sink.chunk_bytes), codec)
        return LinkWritten(len(rows) / max(item.shape[0], 1))

    def fractions(self, link: ChainLink, fraction: float) -> list[float] | None:
        return [*link.fractions, fraction] if link.kind == Kind.INCREMENTAL else None

    def remember(self, item: Remembered, commit_id: str, kept: Kept,
                 old: Shadow | None) -> Shadow | None:
        if item.kind == Kind.INCREMENTAL and old is not None:  # baseline stays the reference
            if old.since_base is not None and old.unsaved is not None:
                old.since_base |= old.unsaved
                old.unsaved[:] = False
            return old
        # full baseline or consecutive: this commit is the new reference, rebuilt exactly
        # when it is lossless and so is everything it builds on
        is_tracked = kept.tracker is not None and kept.tracker.lookup(item.source) is not None
        keep = not is_tracked or kept.xor_rows  # old bits to compare or XOR with
        rows = item.shape[0]
        exact = item.codec.codec_id in LOSSLESS_IDS and (
            item.kind == Kind.FULL or (old is not None and old.exact))
        device = None if is_tracked else kept.on_device
        if device is not None:  # torch, only where a device reference is kept
            from ...device.rows import device_reference
            device = device_reference(device, old.device_values if old else None)
        if device is None and not is_tracked and kept.rows_only:
            # no room on the device for the next reference, and the snapshot holds only the
            # changed rows: the next commit is a full baseline
            return None
        return Shadow(
            commit_id,
            values=None if not keep or device is not None else host_copy(kept.host, old),
            device_values=device,
            since_base=np.zeros(rows, bool) if is_tracked else None,
            unsaved=np.zeros(rows, bool) if is_tracked else None, exact=exact)

    def check(self, e: TensorEntry, base: TensorEntry, link: TensorEntry) -> None:
        parts = link.parts
        rows, values = parts["rows"], parts.get("values") or parts["xvalues"]
        n = rows.shape[0] if len(rows.shape) == 1 and np.dtype(rows.dtype).kind in "iu" \
            else -1  # integer indices of rows
        itemsize = numpy_dtype(base.dtype).itemsize if "xvalues" in parts else None
        if not fits(values, [n, *e.shape[1:]], itemsize):
            raise ManifestError(f"a chain link of {e.path!r} in {rows.commit} does not fit "
                                "the tensor")

    def replay(self, chain: list[TensorEntry], source: ChainSource,
               out: np.ndarray | None = None) -> np.ndarray:
        base = source.host(chain[0], out)
        if any(link.kind not in self.kinds for link in chain[1:]):
            raise ManifestError(f"row chain of {chain[-1].path!r} mixes kinds")
        return apply_rows(base, chain[1:], source.blob)


def apply_rows(out: np.ndarray, increments: list[TensorEntry],
               read_blob: Callable[[Blob], np.ndarray]) -> np.ndarray:
    """Apply the changed rows of each increment, oldest first, onto the baseline ``out``
    (``xvalues``: the new bits are the old ones XOR the stored ones), in place where it is
    writable."""
    out = writable(out, increments)
    for inc in increments:
        rows = read_blob(inc.parts["rows"])
        xor = "xvalues" in inc.parts
        values = read_blob(inc.parts["xvalues" if xor else "values"])
        if rows.ndim != 1 or values.shape != (len(rows), *out.shape[1:]) or (
                rows.size and (rows.min() < 0 or rows.max() >= out.shape[0])) or (
                xor and values.dtype.itemsize != out.dtype.itemsize):
            raise misfit(f"increment of {inc.path!r}", inc.parts["rows"].commit)
        if xor:
            bits_of(out)[rows] = np.bitwise_xor(bits_of(out)[rows], bits_of(values))
        else:
            out[rows] = values
    return out
