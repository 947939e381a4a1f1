"""One commit written by many ranks: each rank's part a fork, the coordinator's assembly the
merge.

A rank runs steps 1-3 of the one pipeline (:mod:`ckptstore.commit.pipeline`) on the tensors it holds
(its shards of sharded tensors, the replicated tensors the global plan gave it): plan (policy and
chain memory per shard), capture, write into ``data/<commit>/`` under array names of its own
(``r<rank>.``) and its own packed array (``_packed.r<rank>``). What it wrote travels to the
coordinator as :class:`~ckptstore.commit.records.PartEntry` items; :func:`merge` assembles them into one
manifest (:func:`ckptstore.commit.records.assemble_manifest`) and publishes it
(:func:`ckptstore.commit.publish.publish`: manifest, ref, tags, retention). Nothing is visible until
the coordinator moves the ref.

No collective lives here: :mod:`ckptstore.dcp` drives these steps from DCP's save protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..format.ids import new_commit_id
from ..history.manifest import Manifest
from ..commit.pipeline import Metadata, Pipeline
from ..policy import Policy
from ..commit.publish import Target, publish
from ..commit.records import PartEntry, assemble_manifest, plan_entries, plan_packed_info
from ..state.tree import Leaf, Tree
from ..tracking.rows import RowTracker

if TYPE_CHECKING:
    from ..store import Store

__all__ = ["LocalTensor", "PartEntry", "assemble_manifest", "commit_shards", "merge",
           "pack_name", "shard_path", "write_part"]


def shard_path(fqn: str, offsets: Sequence[int]) -> str:
    """The path of one shard's entry: ``"emb.weight@1024,0"``."""
    return f"{fqn}@{','.join(str(o) for o in offsets)}"


def pack_name(rank: int) -> str:
    """The packed array of small tensors one rank writes."""
    return f"_packed.r{rank}"


@dataclass(frozen=True, eq=False)
class LocalTensor:
    """A tensor a rank writes: all of ``fqn``, or its block at ``offsets``."""

    fqn: str
    offsets: tuple[int, ...]
    global_shape: tuple[int, ...]
    tensor: torch.Tensor

    @property
    def whole(self) -> bool:
        return not any(self.offsets) and tuple(self.tensor.shape) == self.global_shape

    @property
    def path(self) -> str:
        return self.fqn if self.whole else shard_path(self.fqn, self.offsets)


def _unshared(tensors: list[LocalTensor]) -> list[LocalTensor]:
    """Copies of tensors that share a storage with an earlier one (tied weights): each part
    entry then has bits of its own, as shards must."""
    seen: set[tuple[object, ...]] = set()
    out = []
    for t in tensors:
        x = t.tensor
        key = (x.device.type, x.device.index, x.untyped_storage().data_ptr())
        if x.numel() and key in seen:
            t = LocalTensor(t.fqn, t.offsets, t.global_shape, x.clone())
        elif x.numel():
            seen.add(key)
        out.append(t)
    return out


def write_part(pipeline: Pipeline, commit_id: str, rank: int, tensors: list[LocalTensor],
               policy: Policy, branch: str, parent_id: str | None,
               tracker: RowTracker | None = None, executor: Executor | None = None
               ) -> list[PartEntry]:
    """Rank ``rank``'s fork of commit ``commit_id``: prepare, capture and write its tensors.

    The chain memory is updated at once (:meth:`~ckptstore.commit.pipeline.Pipeline.write`): a
    reference names this commit, so if the commit never becomes the tip of ``branch`` the next
    commit finds no matching base and writes a full one. The parent's manifest is read only
    when the policy builds chains or the store deduplicates (a shard whose bits equal the
    parent's same shard is referenced, not written). ``tracker`` (:func:`ckptstore.track` on
    the rank's local embedding modules) supplies the touched rows of the shards it tracks: a
    shard whose local tensor is a tracked weight (a DTensor made with ``DTensor.from_local``
    over it, say) or its row-aligned optimizer state; it is cleared once the snapshot is taken.
    ``executor``: the I/O pool (default: the store's).
    """
    tensors = _unshared(tensors)
    blocks = {t.path: (t.fqn, t.offsets, t.global_shape) for t in tensors}
    name = pack_name(rank)
    job = pipeline.fork(rank, [Leaf(t.path, t.tensor) for t in tensors], policy, branch,
                        parent_id, tracker, f"r{rank}.", name, blocks.__getitem__)
    done = pipeline.write(job, pipeline.capture(job), commit_id, executor).done
    pack = plan_packed_info(job.plan, name)
    entries = plan_entries(job.plan, commit_id, done, name)
    stored = [done.results[p.index].stored_bytes if p.index in done.results else 0
              for p in job.plan.tensors]
    if stored:
        stored[0] += done.packed_bytes
    return [PartEntry(t.fqn, t.offsets, t.whole, e, pack, n)
            for t, e, n in zip(tensors, entries, stored)]


def merge(pipeline: Pipeline, target: Target, commit_id: str, message: str,
          metadata: Metadata, tree: Tree, shapes: dict[str, list[int]],
          parts: list[PartEntry]) -> Manifest:
    """The coordinator's merge of a sharded commit: the ranks' ``parts`` assembled into one
    manifest on the parent at ``target.tip``, then published (manifest, ref, tags, the store's
    retention)."""
    repo = pipeline.repo
    parent = repo.manifest(target.tip[1]) if target.tip else None
    manifest = assemble_manifest(commit_id, parent, message, metadata, tree, shapes, parts)
    return publish(repo, target, manifest, retention=pipeline.retention)


def commit_shards(store: Store, ranks: Sequence[Sequence[LocalTensor]], message: str = "",
                  branch: str = "main", policy: Policy | None = None) -> Manifest:
    """Write a sharded commit from one process, ``ranks[r]`` being what rank ``r`` holds.

    The steps of a distributed commit without the collectives (import of a sharded checkpoint,
    simulations of many ranks, tests); the ref moves last, as in :mod:`ckptstore.dcp`.
    """
    pipeline = store.committer
    target = Target(branch, pipeline.repo.refs.tip(branch))
    commit_id = new_commit_id()
    parts = [p for r, local in enumerate(ranks)
             for p in write_part(pipeline, commit_id, r, list(local), policy or store.policy,
                                 branch, target.tip[1] if target.tip else None)]
    shapes: dict[str, list[int]] = {}
    for local in ranks:
        for t in local:
            shapes.setdefault(t.fqn, list(t.global_shape))
    tree = {"dict": [[fqn, {"tensor": i}] for i, fqn in enumerate(shapes)]}
    return merge(pipeline, target, commit_id, message, {}, tree, shapes, parts)
