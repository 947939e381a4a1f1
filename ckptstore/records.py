"""Turn a written plan into its commit manifest (the manifest step of a commit)."""

from __future__ import annotations

import time
from typing import Any

from ._version import __version__
from .manifest import FORMAT_VERSION, Blob, Manifest, PackedInfo, TensorEntry
from .plan import PACKED_ARRAY, CommitPlan, TensorPlan
from .writer import Persisted

__all__ = ["build_manifest"]


def _entry(p: TensorPlan, commit_id: str, done: Persisted) -> TensorEntry:
    common = dict(path=p.path, dtype=p.dtype, shape=p.shape, layout=p.layout,
                  container=p.container)
    if p.layout == "array":
        return TensorEntry(**common, commit=commit_id, array=p.array, codec=p.codec.config(),
                           chunks=list(p.grid.chunks), nbytes=p.nbytes)
    if p.layout == "packed":
        return TensorEntry(**common, commit=commit_id, offset=p.offset, nbytes=p.nbytes)
    if p.layout == "chain":
        c = p.chain
        fraction = done.fractions[id(p)]
        return TensorEntry(**common, kind=c.kind, base_commit=c.base_commit, chain=c.chain,
                           parts={k: Blob(**v) for k, v in done.parts[id(p)].items()},
                           codec=p.codec.config(), chunks=list(p.grid.chunks), nbytes=p.nbytes,
                           fractions=[*c.fractions, fraction] if c.kind == "incremental" else None)
    return TensorEntry(**common, base=p.base, storage_offset=p.storage_offset, stride=p.stride)


def build_manifest(commit_id: str, parent: Manifest | None, message: str,
                   metadata: dict[str, Any], tree: Any, plan: CommitPlan,
                   done: Persisted) -> Manifest:
    """The immutable record of a commit whose data ``done`` describes."""
    packed = (PackedInfo(array=PACKED_ARRAY, nbytes=plan.packed_nbytes, codec=plan.codec.config(),
                         chunks=list(plan.packed_grid.chunks)) if plan.packed_nbytes else None)
    return Manifest(format_version=FORMAT_VERSION, id=commit_id,
                    parent=parent.id if parent else None,
                    generation=parent.generation + 1 if parent else 0, time=time.time(),
                    message=message, metadata=metadata, tree=tree,
                    tensors=[_entry(p, commit_id, done) for p in plan.tensors],
                    storages=[_entry(p, commit_id, done) for p in plan.storages], packed=packed,
                    logical_bytes=plan.logical_bytes, stored_bytes=done.stored_bytes,
                    library=__version__)
