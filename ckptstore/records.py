"""Turn a written plan into its commit manifest (the manifest step of a commit)."""

from __future__ import annotations

import time

from ._version import __version__
from .layout import PACKED_ARRAY
from .manifest import Kind, Manifest, PackedInfo, TensorEntry, version_needed
from .plan import AliasItem, ArrayItem, ChainItem, CommitPlan, PackedItem, PlanItem
from .state import Tree
from .writer import Persisted, WriteResult

__all__ = ["build_manifest", "plan_entries", "plan_packed_info"]


def _entry(p: PlanItem, commit_id: str, done: WriteResult | None,
           pack: str | None) -> TensorEntry:
    common = dict(path=p.path, dtype=p.dtype, shape=list(p.shape), layout=p.layout,
                  container=p.container,
                  dim_order=list(p.dim_order) if p.dim_order is not None else None)
    if isinstance(p, ChainItem):
        link = p.link
        fractions = [*link.fractions, done.fraction] if link.kind == Kind.INCREMENTAL else None
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


def build_manifest(commit_id: str, parent: Manifest | None, message: str,
                   metadata: dict[str, object], tree: Tree, plan: CommitPlan,
                   done: Persisted) -> Manifest:
    """The immutable record of a commit whose data ``done`` describes."""
    packed = plan_packed_info(plan)
    entries = plan_entries(plan, commit_id, done)
    return Manifest(format_version=version_needed(entries, False), id=commit_id,
                    parent=parent.id if parent else None,
                    generation=parent.generation + 1 if parent else 0, time=time.time(),
                    message=message, metadata=metadata, tree=tree,
                    tensors=entries[: plan.n_tensors], storages=entries[plan.n_tensors:],
                    packed=packed, logical_bytes=plan.logical_bytes,
                    stored_bytes=done.stored_bytes, library=__version__)
