"""One commit written by many ranks: each rank persists its part, the coordinator assembles it.

A rank runs the single-process steps on the tensors it holds (its shards of sharded tensors, the
replicated tensors the global plan gave it): plan (policy and chain memory per shard), snapshot,
persist into ``data/<commit>/`` under array names of its own (``r<rank>.``) and its own packed
array (``_packed.r<rank>``). What it wrote travels to the coordinator as :class:`PartEntry`
items; :func:`assemble_manifest` turns them into one manifest (format 2): whole tensors as
ordinary entries, a sharded tensor as a ``sharded`` entry whose pieces are entries of
:attr:`~ckptstore.manifest.Manifest.shards`. Nothing is visible until the coordinator writes the
manifest and moves the ref.

No collective lives here: :mod:`ckptstore.dcp` drives these steps from DCP's save protocol.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any
from dataclasses import dataclass

import torch
from pydantic import ValidationError

from ._version import __version__
from .arrays import storage_dtype, torch_dtype
from .committer import Committer
from .dedup import Dedup
from .devquant import staged_items
from .errors import DistributedError
from .manifest import Layout, Manifest, PackedInfo, ShardPiece, TensorEntry, version_needed
from .plan import plan_commit
from .policy import Policy
from .policy.retention import retain_after_commit
from .records import plan_entries, plan_packed_info
from .sensitivity import capture_gradients, score_snapshot
from .shrinking import shrink_snapshot
from .state import Leaf, Tree
from .tracking import RowTracker
from .snapshot import snapshot
from .writer import persist

__all__ = ["LocalTensor", "PartEntry", "assemble_manifest", "commit_shards", "pack_name",
           "shard_path", "write_part"]


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


@dataclass(frozen=True)
class PartEntry:
    """What a rank wrote for one tensor (travels to the coordinator in DCP's write results)."""

    fqn: str
    offsets: tuple[int, ...]
    whole: bool
    entry: TensorEntry
    pack: PackedInfo | None  # the rank's packed array, if it packed anything
    stored_bytes: int = 0    # what its chunks take on the store (a rank's packed array: its first)


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


def write_part(committer: Committer, commit_id: str, rank: int, tensors: list[LocalTensor],
               policy: Policy, branch: str, parent_id: str | None,
               tracker: RowTracker | None = None) -> list[PartEntry]:
    """Plan, snapshot and persist one rank's tensors into commit ``commit_id``.

    The chain memory is updated at once: a reference names this commit, so if the commit never
    becomes the tip of ``branch`` the next commit finds no matching base and writes a full one.
    The parent's manifest (every rank's entries: megabytes at a thousand ranks) is read only
    when the policy builds chains or the store deduplicates (a shard whose bits equal the
    parent's same shard is referenced, not written). ``tracker`` (:func:`ckptstore.track` on the rank's local
    embedding modules) supplies the touched rows of the shards it tracks: a shard whose local
    tensor is a tracked weight (a DTensor made with ``DTensor.from_local`` over it, say) or its
    row-aligned optimizer state; it is cleared once the snapshot is taken.
    """
    policy = committer.resolve_bits(policy)
    wants_chains = policy.incremental != "off" or policy.delta or policy.shrink is not None
    dedup = committer.options.dedup
    parent = (committer.repo.manifest(parent_id) if parent_id and (wants_chains or dedup)
              else None)
    tensors = _unshared(tensors)
    leaves = [Leaf(t.path, t.tensor) for t in tensors]
    fqn_of = {t.path: t.fqn for t in tensors}

    def policy_path(path: str) -> str:  # a block's path, <fqn>@<offsets>, is <fqn> to policies
        return fqn_of.get(path, path)

    decide = committer.chains.decider(policy, branch, parent, tracker, policy_path=policy_path)
    plan = plan_commit(leaves, committer.options, decide, array_prefix=f"r{rank}.")
    blocks = {t.path: (t.fqn, t.offsets, t.global_shape) for t in tensors}
    gradients = (capture_gradients(plan, policy.sensitivity, blocks.__getitem__)
                 if policy.sensitivity is not None else None)
    snap = snapshot(plan, stage=staged_items(plan, committer.options.device_encode))
    if tracker is not None:
        tracker.clear()  # the rows seen so far are in the plan
    snap.settle(committer.staging)  # increments compared on their device: their changed rows
    if policy.shrink is not None:  # each rank shrinks its blocks (its own Fisher threshold)
        shrink_snapshot(plan, snap, policy.shrink, policy_path=policy_path)
    if gradients is not None and gradients.averages:  # each rank ranks its blocks' values
        score_snapshot(snap, gradients)
    name = pack_name(rank)
    done = persist(committer.repo.storage, commit_id, plan, snap, committer.repo.executor,
                   committer.max_inflight, committer.options.chunk_bytes, packed_name=name,
                   dedup=Dedup.against(parent, set(fqn_of)) if dedup else None)
    committer.chains.commit_done(branch, commit_id, plan, snap.arrays,
                                 {i: r.codes for i, r in done.results.items()}, tracker,
                                 {i: r.rebuilt for i, r in done.results.items()},
                                 snap.next_references, snap.gathered)
    pack = plan_packed_info(plan, name)
    entries = plan_entries(plan, commit_id, done, name)
    stored = [done.results[p.index].stored_bytes if p.index in done.results else 0
              for p in plan.tensors]
    if stored:
        stored[0] += done.packed_bytes
    return [PartEntry(t.fqn, t.offsets, t.whole, e, pack, n)
            for t, e, n in zip(tensors, entries, stored)]


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
    """The manifest of a sharded commit.

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
        held = [g for g in got if math.prod(g.entry.shape)] or got[:1]
        got = held
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
    stored = sum(p.stored_bytes for p in parts)
    try:
        return Manifest(format_version=version_needed([*tensors, *shards], bool(shards or packs)),
                        id=commit_id, parent=parent.id if parent else None,
                        generation=parent.generation + 1 if parent else 0, time=time.time(),
                        message=message, metadata=metadata, tree=tree, tensors=tensors,
                        shards=shards, packs=sorted(packs, key=lambda p: p.array),
                        logical_bytes=logical, stored_bytes=stored, library=__version__)
    except ValidationError as e:  # shards that overlap or leave gaps, two at one offset, ...
        raise DistributedError(f"the ranks' parts do not make a valid commit: {e}") from None



def commit_shards(store: Any, ranks: Sequence[Sequence[LocalTensor]], message: str = "",
                  branch: str = "main", policy: Policy | None = None) -> Manifest:
    """Write a sharded commit from one process, ``ranks[r]`` being what rank ``r`` holds.

    The steps of a distributed commit without the collectives (import of a sharded checkpoint,
    simulations of many ranks, tests); the ref moves last, as in :mod:`ckptstore.dcp`.
    """
    from .ids import new_commit_id

    repo = store.repo
    tip = repo.refs.tip(branch)
    parent = repo.manifest(tip[1]) if tip else None
    commit_id = new_commit_id()
    parts = [p for r, local in enumerate(ranks)
             for p in write_part(store._committer, commit_id, r, list(local),
                                 policy or store.policy, branch, tip[1] if tip else None)]
    shapes: dict[str, list[int]] = {}
    for local in ranks:
        for t in local:
            shapes.setdefault(t.fqn, list(t.global_shape))
    tree = {"dict": [[fqn, {"tensor": i}] for i, fqn in enumerate(shapes)]}
    m = assemble_manifest(commit_id, parent, message, {}, tree, shapes, parts)
    repo.write_manifest(m)
    repo.refs.advance(branch, tip, commit_id)
    keep = getattr(store, "keep", None)  # open(url, keep=...): once the commit landed
    if keep is not None:
        retain_after_commit(repo, keep, commit_id)
    return m
