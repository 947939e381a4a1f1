"""``StorageWriter``: ``dcp.save`` into a ckptstore, one commit written by every rank.

Every rank's ``write_data`` is its fork of the one commit pipeline
(:func:`ckptstore.dcp.shards.write_part`); the coordinator's ``finish`` is the merge
(:func:`ckptstore.dcp.shards.merge`: the manifest, then the ref, then tags and retention). Non-tensor values are stored as plain msgpack, never pickled (see
:mod:`ckptstore.dcp`).

On a tiered store (``store.tiers``: each rank has a local tier of its own) every rank's
``write_data`` journals its part once it is durable (``tiers.part_written``), before the
coordinator moves any ref; the coordinator's ``finish`` hands the manifest's bytes back with
DCP's metadata, which ``dcp.save`` returns on every rank: :meth:`StorageWriter.adopt` keeps them
on a rank's local tier (``Store.commit`` calls it).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import storage as dcp_storage
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType

from ..errors import DistributedError, UnsupportedLeafError
from ..format.ids import new_commit_id
from ..info import CommitInfo
from ..format.layout import check_ref_name, manifest_key
from ..commit.pipeline import plain_metadata
from ..policy import Policy
from ..commit.publish import Target, check_tags_free, tag_names
from ..history.refs import Tip
from .shards import LocalTensor, PartEntry, merge, write_part
from ..state.tree import Tree, flatten
from ..tracking.rows import RowTracker

if TYPE_CHECKING:
    from ..store import Store

__all__ = ["StorageWriter"]


class TierParts(Protocol):
    """What a tiered store's tiers do with a sharded commit (:class:`ckptstore.tiers.Tiers`)."""

    def part_written(self, commit: str, branch: str, rank: int, world: int) -> None: ...

    def adopt(self, manifest: bytes, commit: str, branch: str) -> None: ...


_MANIFEST = "ckptstore.manifest"  # the key of the manifest's bytes in DCP's storage_data


@dataclass(frozen=True)
class _Assignment:
    """What the coordinator's global plan tells each rank: the commit, its parent, the rank
    and how many ranks write."""

    commit_id: str
    parent: str | None
    rank: int
    world: int = 1
    parent_manifest: bytes | None = None  # a tiered store: each rank keeps it (adopt)


@dataclass(frozen=True)
class _Value:
    """A non-tensor value (BYTE_IO item) as a plain tree, on its way to the coordinator."""

    tree: Tree


class StorageWriter(dcp_storage.StorageWriter):
    """Commit a ``dcp.save`` into a store: one commit on ``branch`` with ``message``/``tags``.

    ``policy`` (default: the store's) encodes each rank's shards as ``Store.commit`` encodes
    tensors; ``tracker`` (this rank's :func:`ckptstore.track`) supplies the touched rows of the
    shards it tracks. ``tree`` and ``order`` (``Store.commit`` under a process group passes
    them) are the state's own tree and its tensors' paths in the tree's order; without them the
    tree is rebuilt from DCP's metadata. After the save, :attr:`last_commit` on the coordinator is
    the new commit's :class:`~ckptstore.CommitInfo`, :attr:`commit_id` on every rank its id.
    """

    def __init__(self, store: Store, message: str = "", branch: str = "main",
                 tags: Sequence[str] = (), policy: Policy | None = None,
                 metadata: dict[str, object] | None = None, tracker: RowTracker | None = None,
                 tree: Tree | None = None, order: Sequence[str] | None = None):
        super().__init__()
        self.store = store
        self.message = message
        self.branch = check_ref_name(branch, "branch")
        self.tags = tag_names(tags)
        self.policy = policy
        self.metadata = plain_metadata(metadata, None)
        self.tracker = tracker
        self.last_commit: CommitInfo | None = None
        self.rank = 0
        self.is_coordinator = True
        self._tip: Tip | None = None
        self._tree = tree
        self._order = list(order) if order is not None else None
        self._commit_id = ""
        # the collective paths set it where the store's persist process writes this rank's
        # part (``committer.parts_in_process``): sent there, not forked on this thread
        self.in_process = False

    @property
    def commit_id(self) -> str:
        """The id of the commit this save writes (known on every rank once it wrote)."""
        return self._commit_id

    # -- DCP's protocol ----------------------------------------------------------------------
    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        self.last_commit = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank", dist.get_rank() if dist.is_initialized() else 0)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """On the coordinator: the commit id, the parent every rank builds chains on."""
        repo = self.store.repo
        check_tags_free(repo, self.tags)
        self._tip = repo.refs.tip(self.branch)
        commit_id = self._commit_id = new_commit_id()
        parent = self._tip[1] if self._tip else None
        # a tiered store: a rank whose local tier missed the parent (killed before it adopted
        # it, the parent not uploaded yet) gets it here, and with it the branch
        known = (self.store.storage.read(manifest_key(parent))
                 if parent is not None and self._tiers() is not None else None)
        return [replace(p, storage_data=_Assignment(commit_id, parent, i, len(plans), known))
                for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> torch.futures.Future:
        a = plan.storage_data
        if not isinstance(a, _Assignment):
            raise DistributedError("the save plan carries no ckptstore assignment: "
                                   "use ckptstore.dcp.StorageWriter on every rank")
        tensors: list[LocalTensor] = []
        results: list[dcp_storage.WriteResult] = []
        for item in plan.items:
            if item.type == WriteItemType.BYTE_IO:
                results.append(dcp_storage.WriteResult(
                    index=item.index, size_in_bytes=0,
                    storage_data=_Value(_plain_tree(planner, item.index))))
                continue
            data = planner.resolve_data(item)
            chunk = item.tensor_data.chunk
            tensors.append(LocalTensor(item.index.fqn, tuple(chunk.offsets),
                                       tuple(item.tensor_data.size), data.detach()))
        store = self.store
        self._commit_id = a.commit_id  # every rank knows the commit it writes
        tiers = self._tiers()
        if tiers is not None and a.parent is not None and a.parent_manifest is not None \
                and not self.is_coordinator:
            tiers.adopt(a.parent_manifest, a.parent, self.branch)
        policy = self.policy or store.policy
        if self.in_process:
            parts = store.committer.part(a.commit_id, a.rank, tensors, policy,
                                         self.branch, a.parent)
        else:
            parts = write_part(store.committer, a.commit_id, a.rank, tensors, policy,
                               self.branch, a.parent, self.tracker)
        if tiers is not None:  # durable locally: journalled before any ref moves
            tiers.part_written(a.commit_id, self.branch, a.rank, a.world)
        results += [dcp_storage.WriteResult(
            index=MetadataIndex(p.fqn, torch.Size(p.offsets)), size_in_bytes=p.stored_bytes,
            storage_data=p) for p in parts]
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[dcp_storage.WriteResult]]) -> None:
        """On the coordinator, once every rank wrote: the manifest, then the ref, then tags, then
        the store's retention rule (``open(url, keep=...)``)."""
        parts: list[PartEntry] = []
        values: dict[str, Tree] = {}
        for rank_results in results:
            for r in rank_results:
                if isinstance(r.storage_data, _Value):
                    values[r.index.fqn] = r.storage_data.tree
                elif isinstance(r.storage_data, PartEntry):
                    parts.append(r.storage_data)
                else:
                    raise DistributedError(f"rank result for {r.index.fqn!r} is not ckptstore's")
        shapes = {fqn: list(md.size) for fqn, md in metadata.state_dict_metadata.items()
                  if isinstance(md, TensorStorageMetadata)}
        if self._tree is not None:
            tree, shapes = self._tree, {fqn: shapes[fqn] for fqn in self._order or ()}
        else:
            tree = _nested_tree(metadata, values)
        manifest = merge(self.store.committer, Target(self.branch, self._tip, self.tags),
                         self._commit_id, self.message, self.metadata, tree, shapes, parts)
        self.last_commit = CommitInfo.from_manifest(manifest)
        if self._tiers() is not None:  # every rank's local tier keeps it (adopt)
            metadata.storage_data = {_MANIFEST: self.store.storage.read(
                manifest_key(manifest.id))}

    def adopt(self, metadata: Metadata | None) -> None:
        """After ``dcp.save`` returned ``metadata`` on a rank other than the coordinator of a
        tiered store: the commit's manifest and branch move on this rank's local tier."""
        tiers = self._tiers()
        data = getattr(metadata, "storage_data", None)
        if tiers is None or self.is_coordinator or not isinstance(data, dict):
            return
        manifest = data.get(_MANIFEST)
        if isinstance(manifest, bytes):
            tiers.adopt(manifest, self._commit_id, self.branch)

    def _tiers(self) -> TierParts | None:
        return getattr(self.store, "tiers", None)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return False  # a store is named by the writer's store, not by a checkpoint id

    def storage_meta(self) -> None:
        return None


def _plain_tree(planner: SavePlanner, index: MetadataIndex) -> Tree:
    """A non-tensor value of the state as a plain tree; refuses what would need pickling."""
    lookup = getattr(planner, "lookup_object", None)
    if lookup is None:
        raise DistributedError(
            f"the save planner {type(planner).__name__} cannot hand over the value at "
            f"{index.fqn!r} unpickled (it has no lookup_object); use DefaultSavePlanner")
    tree, leaves = flatten({index.fqn: lookup(index)})
    tree = tree["dict"][0][1]
    if leaves:
        raise UnsupportedLeafError(f"the value at {index.fqn!r} holds tensors inside a "
                                   "non-tensor container; make them entries of the state dict")
    return tree


class _Node(dict):
    """A container being rebuilt from DCP's flat keys (see :func:`_nested_tree`)."""


def _nested_tree(metadata: Metadata, values: dict[str, Tree]) -> Tree:
    """The tree of a ``dcp.save``: DCP's flat keys put back into the nesting its planner
    recorded (``planner_data``: fqn -> key path), tensors numbered in DCP's order."""
    mappings = metadata.planner_data if isinstance(metadata.planner_data, dict) else {}
    root = _Node()
    n = 0
    for fqn, md in metadata.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            leaf: Tree = {"tensor": n}
            n += 1
        elif fqn in values:
            leaf = values[fqn]
        else:
            raise DistributedError(f"no rank wrote the value at {fqn!r}")
        path = tuple(mappings.get(fqn) or (fqn,))
        node = root
        for key in path[:-1]:
            child = node.setdefault(key, _Node())
            if not isinstance(child, _Node):
                path = (fqn,)  # a key path that runs through a leaf: keep the flat key
                node = root
                break
            node = child
        node[path[-1]] = leaf
    return _as_tree(root)


def _as_tree(node: object) -> Tree:
    if not isinstance(node, _Node):
        return node  # type: ignore[return-value]
    if node and all(isinstance(k, int) for k in node) and sorted(node) == list(range(len(node))):
        return {"list": [_as_tree(node[i]) for i in range(len(node))]}
    return {"dict": [[k, _as_tree(v)] for k, v in node.items()]}


