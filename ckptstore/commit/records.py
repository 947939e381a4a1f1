"""The one manifest builder: a written plan, or the parts ranks wrote, as a commit record.

:func:`build_manifest` records a single-process commit, :func:`assemble_manifest` the merge of a
sharded one (its ranks' :class:`PartEntry` items); both construct the :class:`Manifest` through
:func:`commit_record`, the one place that computes its format version, generation and time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from .._version import __version__
from ..format.arrays import storage_dtype, torch_dtype
from ..chains.kinds import chain_kind
from ..errors import DistributedError
from ..format.layout import PACKED_ARRAY
from ..history.manifest import (Layout, Manifest, PackedInfo, ShardPiece, TensorEntry,
                       version_needed)
from .plan import AliasItem, ArrayItem, ChainItem, CommitPlan, PackedItem, PlanItem
from ..state.tree import Tree
from .persist import Persisted, WriteResult

__all__ = ["PartEntry", "assemble_manifest", "build_manifest", "commit_record", "plan_entries",
           "plan_packed_info"]


def _entry(p: PlanItem, commit_id: str, done: WriteResult | None,
           pack: str | None) -> TensorEntry:
    common = dict(path=p.path, dtype=p.dtype, shape=list(p.shape), layout=p.layout,
                  container=p.container,
                  dim_order=list(p.dim_order) if p.dim_order is not None else None)
    if isinstance(p, ChainItem):
        link = p.link
        fractions = chain_kind(link.kind).fractions(link, done.fraction)
        return TensorEntry(**common, kind=link.kind, base_commit=link.base_commit,
                           chain=link.chain, parts=dict(done.parts), codec=p.codec.config(),
                           chunks=list(p.grid.chunks), nbytes=p.nbytes, fractions=fractions)
    if isinstance(p, ArrayItem):
        reused = done.reused if done is not None else None
        return TensorEntry(**common, commit=reused.commit if reused else commit_id,
                           array=reused.array if reused else p.array, codec=p.codec.config(),
                           chunks=list(p.grid.chunks), nbytes=p.nbytes,
                           digest=done.digest if done is not None else None,
                           chunk_digests=done.chunk_digests if done is not None else None)
    if isinstance(p, PackedItem):
        return TensorEntry(**common, commit=commit_id, offset=p.offset, nbytes=p.nbytes,
                           array=pack)
    if isinstance(p, AliasItem):
        return TensorEntry(**common, base=p.base)
    return TensorEntry(**common, base=p.base, storage_offset=p.storage_offset,
                       stride=list(p.stride))


def plan_entries(plan: CommitPlan, commit_id: str, done: Persisted,
                 pack: str | None = None) -> list[TensorEntry]:
    """The manifest entries of a written plan, in plan order; packed ones lie in ``pack`` (a
    rank's packed array of a sharded commit; None: the commit's one packed array)."""
    return [_entry(p, commit_id, done.results.get(p.index), pack) for p in plan.items]


def plan_packed_info(plan: CommitPlan, name: str = PACKED_ARRAY) -> PackedInfo | None:
    """The packed array a written plan filled (None if it packed nothing)."""
    if not plan.packed_nbytes:
        return None
    return PackedInfo(array=name, nbytes=plan.packed_nbytes, codec=plan.codec.config(),
                      chunks=list(plan.packed_grid.chunks))


def commit_record(commit_id: str, parent: Manifest | None, message: str,
                  metadata: dict[str, object], tree: Tree, tensors: list[TensorEntry], *,
                  logical_bytes: int, stored_bytes: int,
                  storages: Sequence[TensorEntry] = (), packed: PackedInfo | None = None,
                  shards: Sequence[TensorEntry] = (),
                  packs: Sequence[PackedInfo] = ()) -> Manifest:
    """The :class:`Manifest` of commit ``commit_id`` on ``parent``: the oldest format that holds
    its entries, the next generation, the time now."""
    return Manifest(format_version=version_needed([*tensors, *storages, *shards],
                                                  bool(shards or packs)),
                    id=commit_id, parent=parent.id if parent else None,
                    generation=parent.generation + 1 if parent else 0, time=time.time(),
                    message=message, metadata=metadata, tree=tree, tensors=tensors,
                    storages=list(storages), packed=packed, shards=list(shards),
                    packs=list(packs), logical_bytes=logical_bytes, stored_bytes=stored_bytes,
                    library=__version__)


def build_manifest(commit_id: str, parent: Manifest | None, message: str,
                   metadata: dict[str, object], tree: Tree, plan: CommitPlan,
                   done: Persisted) -> Manifest:
    """The immutable record of a commit whose data ``done`` describes."""
    entries = plan_entries(plan, commit_id, done)
    return commit_record(commit_id, parent, message, metadata, tree, entries[: plan.n_tensors],
                         storages=entries[plan.n_tensors:], packed=plan_packed_info(plan),
                         logical_bytes=plan.logical_bytes, stored_bytes=done.stored_bytes)


@dataclass(frozen=True)
class PartEntry:
    """What a rank wrote for one tensor (travels to the coordinator in DCP's write results)."""

    fqn: str
    offsets: tuple[int, ...]
    whole: bool
    entry: TensorEntry
    pack: PackedInfo | None  # the rank's packed array, if it packed anything
    stored_bytes: int = 0    # what its chunks take on the store (a rank's packed array: its first)

    def to_plain(self) -> dict[str, object]:
        """As plain values (msgpack-able): a persist process's answer to a rank's part."""
        return {"fqn": self.fqn, "offsets": list(self.offsets), "whole": self.whole,
                "entry": self.entry.model_dump(mode="python"),
                "pack": None if self.pack is None else self.pack.model_dump(mode="python"),
                "stored": self.stored_bytes}

    @classmethod
    def from_plain(cls, raw: object) -> PartEntry:
        """The inverse of :meth:`to_plain`, validated; :class:`DistributedError` if malformed."""
        try:
            assert isinstance(raw, dict)
            offsets = tuple(int(o) for o in raw["offsets"])
            pack = raw["pack"]
            return cls(str(raw["fqn"]), offsets, bool(raw["whole"]),
                       TensorEntry.model_validate(raw["entry"]),
                       None if pack is None else PackedInfo.model_validate(pack),
                       int(raw["stored"]))
        except (AssertionError, KeyError, TypeError, ValueError, ValidationError) as e:
            raise DistributedError(f"a rank's part entry that is not ckptstore's: {e}") from None


def _sharded_entry(commit_id: str, fqn: str, shape: list[int], got: list[PartEntry],
                   shards: list[TensorEntry]) -> TensorEntry:
    pieces = []
    for g in sorted(got, key=lambda g: g.offsets):
        shards.append(g.entry)
        pieces.append(ShardPiece(offsets=list(g.offsets), entry=len(shards) - 1))
    dtype = got[0].entry.dtype
    nbytes = math.prod(shape) * storage_dtype(torch_dtype(dtype)).itemsize
    return TensorEntry(path=fqn, dtype=dtype, shape=shape, layout=Layout.SHARDED,
                       commit=commit_id, pieces=pieces, nbytes=nbytes)


def assemble_manifest(commit_id: str, parent: Manifest | None, message: str,
                      metadata: dict[str, object], tree: Tree,
                      shapes: dict[str, list[int]], parts: list[PartEntry]) -> Manifest:
    """The manifest of a sharded commit (format 2): whole tensors as ordinary entries, a
    sharded tensor as a ``sharded`` entry whose pieces are entries of
    :attr:`~ckptstore.history.manifest.Manifest.shards`.

    ``shapes`` gives every tensor's global shape, in the order of the tree's tensor indices;
    ``parts`` is what every rank wrote. Raises :class:`DistributedError` unless the parts are
    exactly one whole entry or a set of shards for each tensor.
    """
    by_fqn: dict[str, list[PartEntry]] = {}
    for p in parts:
        by_fqn.setdefault(p.fqn, []).append(p)
    tensors: list[TensorEntry] = []
    shards: list[TensorEntry] = []
    logical = 0
    for fqn, shape in shapes.items():
        got = by_fqn.pop(fqn, [])
        if not got:
            raise DistributedError(f"no rank wrote tensor {fqn!r}")
        # ranks with nothing of a tensor (DTensor gives an empty shard the offset of the
        # dimension's end) take no part in it, unless the tensor itself is empty
        got = [g for g in got if math.prod(g.entry.shape)] or got[:1]
        if len(got) == 1 and got[0].whole:
            tensors.append(got[0].entry)
        elif any(g.whole for g in got):
            raise DistributedError(f"tensor {fqn!r} was written whole and in shards")
        else:
            tensors.append(_sharded_entry(commit_id, fqn, list(shape), got, shards))
        logical += tensors[-1].nbytes or 0
    if by_fqn:
        raise DistributedError(f"ranks wrote tensors the plan does not have: {sorted(by_fqn)[:5]}")
    packs = list({p.pack.array: p.pack for p in parts if p.pack is not None}.values())
    try:
        return commit_record(commit_id, parent, message, metadata, tree, tensors, shards=shards,
                             packs=sorted(packs, key=lambda p: p.array), logical_bytes=logical,
                             stored_bytes=sum(p.stored_bytes for p in parts))
    except ValidationError as e:  # shards that overlap or leave gaps, two at one offset, ...
        raise DistributedError(f"the ranks' parts do not make a valid commit: {e}") from None
