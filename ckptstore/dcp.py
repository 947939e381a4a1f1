"""torch.distributed.checkpoint (DCP) storage for a ckptstore: sharded commits and checkouts.

``dcp.save(state_dict, storage_writer=StorageWriter(store))`` commits into a store and
``dcp.load(state_dict, storage_reader=StorageReader(store, "main"))`` checks out of it. DCP does
the planning (dedup of replicated tensors, DTensor and ShardedTensor chunks, resharding on
load); ckptstore does the storage:

- every rank persists the tensors its plan gives it (:func:`ckptstore.sharded.write_part`: the
  store's policy per shard -- quantized, incremental, delta -- and its own packed array);
- the coordinator's ``finish`` writes the manifest and only then moves the ref: a rank that
  fails makes DCP fail the save before ``finish``, leaving the ref where it was;
- a load reads, on each rank, only the chunks that overlap what the rank asks for.

No pickle: DCP's planners ``torch.save`` non-tensor values (step counters, param_groups) and read
them with ``torch.load(weights_only=False)``. The writer stores such values as plain msgpack in
the manifest's tree (as ``Store.commit`` stores plain leaves); the reader hands DCP only bytes it
made itself from those plain values, after ``torch.load(weights_only=True)`` accepted them.
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint import storage as dcp_storage
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,
                                                   Metadata, MetadataIndex,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner, SavePlan,
                                                  SavePlanner, WriteItemType)

from .arrays import host_to_tensor, start_read_region, torch_dtype
from .chains.walk import entry_array
from .chunkcodec import codec_from_config
from .committer import _plain_metadata
from .errors import CkptStoreError, DistributedError, ManifestError, RefExists, UnsupportedLeafError
from .ids import new_commit_id
from .pending import PendingCommit
from .info import CommitInfo
from .layout import check_ref_name, tag_key
from .manifest import Layout, Manifest, TensorEntry
from .policy import Policy
from .reader import Reader
from .refs import Tip
from .sharded import LocalTensor, PartEntry, assemble_manifest, write_part
from .state import Tree, flatten, unflatten

__all__ = ["StorageReader", "StorageWriter"]


@dataclass(frozen=True)
class _Assignment:
    """What the coordinator's global plan tells each rank: the commit and its parent."""

    commit_id: str
    parent: str | None
    rank: int


@dataclass(frozen=True)
class _Value:
    """A non-tensor value (BYTE_IO item) as a plain tree, on its way to the coordinator."""

    tree: Tree


class StorageWriter(dcp_storage.StorageWriter):
    """Commit a ``dcp.save`` into a store: one commit on ``branch`` with ``message``/``tags``.

    ``policy`` (default: the store's) encodes each rank's shards as ``Store.commit`` encodes
    tensors. After the save, :attr:`last_commit` on the coordinator is the new commit's
    :class:`~ckptstore.CommitInfo`.
    """

    def __init__(self, store: Any, message: str = "", branch: str = "main",
                 tags: Sequence[str] = (), policy: Policy | None = None,
                 metadata: dict[str, object] | None = None):
        super().__init__()
        self.store = store
        self.message = message
        self.branch = check_ref_name(branch, "branch")
        self.tags = tuple(check_ref_name(t, "tag") for t in ([tags] if isinstance(tags, str)
                                                             else tags))
        self.policy = policy
        self.metadata = _plain_metadata(metadata or {}, None)
        self.last_commit: CommitInfo | None = None
        self.rank = 0
        self.is_coordinator = True
        self._tip: Tip | None = None
        self._tree: Tree | None = None   # set by Store.commit: its own tree of the state
        self._order: list[str] | None = None
        self._commit_id = ""

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
        for t in self.tags:
            if repo.storage.exists(tag_key(t)):
                raise RefExists(f"tag {t!r} already exists; choose another name")
        self._tip = repo.refs.tip(self.branch)
        commit_id = self._commit_id = new_commit_id()
        parent = self._tip[1] if self._tip else None
        return [replace(p, storage_data=_Assignment(commit_id, parent, i))
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
        parts = write_part(store._committer, a.commit_id, a.rank, tensors,
                           self.policy or store.policy, self.branch, a.parent)
        results += [dcp_storage.WriteResult(
            index=MetadataIndex(p.fqn, torch.Size(p.offsets)), size_in_bytes=p.stored_bytes,
            storage_data=p) for p in parts]
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[dcp_storage.WriteResult]]) -> None:
        """On the coordinator, once every rank wrote: the manifest, then the ref, then tags."""
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
        repo = self.store.repo
        parent = repo.manifest(self._tip[1]) if self._tip else None
        manifest = assemble_manifest(self._commit_id, parent, self.message, self.metadata, tree, shapes,
                                     parts)
        repo.write_manifest(manifest)
        repo.refs.advance(self.branch, self._tip, manifest.id)
        for t in self.tags:
            repo.refs.create_tag(t, manifest.id)
        self.last_commit = CommitInfo.from_manifest(manifest)

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


# -- reading ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Located:
    """Where one chunk DCP knows lives: a tensor of the manifest, or a piece of it."""

    tensor: int
    piece: int | None = None


class StorageReader(dcp_storage.StorageReader):
    """Serve ``dcp.load`` from commit ``ref`` of a store, resharding as DCP plans it.

    ``ref`` is resolved once, at the first metadata read (give a commit id so that every rank
    reads the same commit while the branch moves).
    """

    def __init__(self, store: Any, ref: str = "main"):
        super().__init__()
        self.store = store
        self.ref = ref
        self._manifest: Manifest | None = None
        self._values: dict[str, Tree] = {}

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self.ref = str(checkpoint_id)
            self._manifest = None

    @property
    def manifest(self) -> Manifest:
        if self._manifest is None:
            self._manifest = self.store.manifest(self.store.resolve(self.ref))
        return self._manifest

    def read_metadata(self, *args: Any, **_: Any) -> Metadata:
        m = self.manifest
        state: dict[str, Any] = {}
        storage: dict[MetadataIndex, _Located] = {}
        paths = _tensor_paths(m.tree)
        for path, i in paths.items():
            if not 0 <= i < len(m.tensors):
                raise ManifestError(f"commit {m.id} refers to tensors it does not have")
            e = m.tensors[i]
            chunks = []
            for j, (offsets, shape) in enumerate(_blocks(m, e)):
                chunks.append(ChunkStorageMetadata(torch.Size(offsets), torch.Size(shape)))
                storage[MetadataIndex(path, torch.Size(offsets))] = _Located(
                    i, j if e.layout == Layout.SHARDED else None)
            state[path] = TensorStorageMetadata(
                properties=_properties(e), size=torch.Size(e.shape), chunks=chunks)
        self._values = _value_paths(m.tree)
        for path in self._values:
            state[path] = BytesStorageMetadata()
        return Metadata(state_dict_metadata=state, storage_data=storage)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        self._storage = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> torch.futures.Future:
        """Copy every requested block into DCP's targets: blocks of ``array`` entries chunk by
        chunk straight into place, all requests' chunks queued at once; other layouts are
        rebuilt whole once per load and sliced."""
        m = self.manifest
        reader = Reader(self.store.repo)
        whole: dict[int, torch.Tensor] = {}
        futures: list[Any] = []
        direct: list[tuple[Any, torch.Tensor]] = []
        for req in plan.items:
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, _safe_bytes(self._values, req.storage_index.fqn))
                continue
            loc = self._storage.get(req.storage_index)
            if not isinstance(loc, _Located):
                raise ManifestError(f"commit {m.id} has no chunk {req.storage_index}")
            src = _source(m, m.tensors[loc.tensor], loc)
            target = planner.resolve_tensor(req).detach()
            if tuple(target.shape) != tuple(req.lengths):
                raise DistributedError(f"{req.storage_index.fqn!r}: a block of shape "
                                       f"{tuple(req.lengths)} for a target of "
                                       f"{tuple(target.shape)}")
            if src.layout == Layout.ARRAY and src.shape:
                futures += _queue_block(reader, src, req.storage_offsets, req.lengths, target)
                direct.append((req, target))
                continue
            block = _read_block(reader, m, src, loc.tensor, req.storage_offsets, req.lengths,
                                whole)
            target.copy_(block)
            planner.commit_tensor(req, target)
        for f in futures:
            f.result()
        for req, target in direct:
            planner.commit_tensor(req, target)
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(None)
        return fut

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return False


def _properties(e: TensorEntry) -> Any:
    from torch.distributed.checkpoint.metadata import TensorProperties
    return TensorProperties(dtype=torch_dtype(e.dtype))


def _blocks(m: Manifest, e: TensorEntry) -> list[tuple[list[int], list[int]]]:
    """``(offsets, shape)`` of each stored block of a tensor entry."""
    if e.layout != Layout.SHARDED:
        return [([0] * len(e.shape), list(e.shape))]
    return [(p.offsets, m.shards[p.entry].shape) for p in e.pieces]


def _source(m: Manifest, e: TensorEntry, loc: _Located) -> TensorEntry:
    """The entry that holds a located chunk: the tensor's, or its piece's shard entry."""
    if loc.piece is None:
        return e
    if not e.pieces or not 0 <= loc.piece < len(e.pieces):
        raise ManifestError(f"commit {m.id}: {e.path!r} has no piece {loc.piece}")
    return m.shards[e.pieces[loc.piece].entry]


def _queue_block(reader: Reader, src: TensorEntry, offsets: Sequence[int],
                 lengths: Sequence[int], target: torch.Tensor) -> list[Any]:
    """Queue the chunk reads of a block of an ``array`` entry, each copied into ``target``."""
    if any(o < 0 or o + n > s for o, n, s in zip(offsets, lengths, src.shape)) or len(
            offsets) != len(src.shape):
        raise ManifestError(f"a read of {src.path!r} reaches outside its shape {src.shape}")
    a = entry_array(src)

    def put(row: int, part: np.ndarray) -> None:
        target[row: row + part.shape[0]].copy_(host_to_tensor(part, src.dtype))

    return start_read_region(reader.repo.storage, a.prefix, a.grid, a.dtype,
                             codec_from_config(a.codec), reader.repo.executor, offsets, lengths,
                             put)


def _read_block(reader: Reader, m: Manifest, src: TensorEntry, tensor: int,
                offsets: Sequence[int], lengths: Sequence[int], whole: dict[int, torch.Tensor]
                ) -> torch.Tensor:
    """The requested block of an entry that is not an array of its own: packed, chains,
    aliases and views, rebuilt whole once per load and sliced (0-d arrays too)."""
    key = id(src)
    if key not in whole:
        if src.layout in (Layout.ARRAY, Layout.PACKED, Layout.CHAIN):
            whole[key] = host_to_tensor(reader.host(src), src.dtype)
        else:
            whole[key] = torch.as_tensor(reader.read_tensors(m, [tensor])[tensor])
    t = whole[key]
    for d, (o, n) in enumerate(zip(offsets, lengths)):
        t = t.narrow(d, o, n)
    return t


def _tensor_paths(tree: Tree) -> dict[str, int]:
    from .state import tree_paths
    return {p: n["tensor"] for p, n in tree_paths(tree).items() if "tensor" in n}


def _value_paths(tree: Tree) -> dict[str, Tree]:
    """Every subtree that holds no tensor, by dotted path: DCP asks for a non-tensor value at
    whatever depth its own flattening stopped (a whole ``param_groups`` list, say)."""
    out: dict[str, Tree] = {}

    def walk(node: Any, path: str) -> bool:  # True if the node holds a tensor
        if not isinstance(node, dict):
            raise ManifestError(f"invalid state tree node at {path or '<root>'!r}")
        if "tensor" in node:
            return True
        children: list[tuple[str, Any]] = []
        for kind in ("dict", "odict"):
            if kind in node and isinstance(node[kind], list):
                children = [(str(k), v) for k, v in (p for p in node[kind]
                                                      if isinstance(p, list) and len(p) == 2)]
        for kind in ("list", "tuple"):
            if kind in node and isinstance(node[kind], list):
                children = [(str(i), v) for i, v in enumerate(node[kind])]
        has = False
        for k, v in children:
            has |= walk(v, f"{path}.{k}" if path else k)
        if not has and path:
            out[path] = node
        return has

    walk(tree, "")
    return out


def _safe_bytes(values: dict[str, Tree], fqn: str) -> io.BytesIO:
    """DCP's bytes for a plain value: made here from the manifest's msgpack tree, and handed
    over only after ``torch.load(weights_only=True)`` accepted them."""
    if fqn not in values:
        raise ManifestError(f"the commit has no value at {fqn!r}")
    value = unflatten(values[fqn], [])
    buf = io.BytesIO()
    torch.save(value, buf)
    data = buf.getvalue()
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:  # noqa: BLE001 - any refusal of the safe loader
        raise DistributedError(f"the value at {fqn!r} is not a plain value that loads without "
                               f"unpickling arbitrary objects: {e}") from None
    return io.BytesIO(data)


# -- the Store verbs under a process group ---------------------------------------------------
@contextlib.contextmanager
def _unwrapped() -> Iterator[None]:
    """DCP reports failures as a ``CheckpointException`` (a BaseException, not an Exception):
    the Store verbs raise the first rank's ckptstore error itself, else a
    :class:`DistributedError` naming the failed ranks."""
    from torch.distributed.checkpoint.api import CheckpointException
    try:
        yield
    except CheckpointException as e:
        errors = {r: f[0] if isinstance(f, tuple) else f for r, f in e.failures.items()}
        ours = next((x for x in errors.values() if isinstance(x, CkptStoreError)), None)
        if ours is not None:
            raise ours from e
        first = next(iter(errors.values()), None)
        raise DistributedError(f"the commit failed on rank(s) {sorted(errors)}: "
                               f"{type(first).__name__}: {first}") from e


def _dcp_state(leaves: list[Any]) -> dict[str, Any]:
    """``{path: tensor}`` for DCP (numpy leaves as tensors over the same memory)."""
    return {leaf.path: leaf.value if isinstance(leaf.value, torch.Tensor)
            else torch.from_numpy(np.asarray(leaf.value)) for leaf in leaves}


def commit_collective(store: Any, state: object, message: str, branch: str,
                      tags: Sequence[str], metadata: dict[str, object] | None,
                      policy: Policy, process_group: Any = None) -> CommitInfo:
    """``Store.commit`` on every rank of a process group: one commit, DCP's planning."""
    import torch.distributed.checkpoint as dcp

    store._committer.wait()
    tree, leaves = flatten(state)
    writer = StorageWriter(store, message, branch, tags, policy, _plain_metadata(
        metadata or {}, state))
    writer._tree, writer._order = tree, [leaf.path for leaf in leaves]
    with _unwrapped():
        dcp.save(_dcp_state(leaves), storage_writer=writer, process_group=process_group)
    return writer.last_commit or CommitInfo.from_manifest(store.manifest(writer._commit_id))


def commit_async_collective(store: Any, state: object, message: str, branch: str,
                            tags: Sequence[str], metadata: dict[str, object] | None,
                            policy: Policy) -> PendingCommit:
    """``Store.commit_async`` on every rank: DCP's ``async_save`` stages the local shards, then
    a background thread commits them over a gloo group of the store's own, so the commit's
    collectives never interleave with training's."""
    import time

    import torch.distributed.checkpoint as dcp

    t0 = time.perf_counter()
    store._committer.wait()
    if getattr(store, "_async_group", None) is None:
        store._async_group = dist.new_group(backend="gloo")
    tree, leaves = flatten(state)
    writer = StorageWriter(store, message, branch, tags, policy, _plain_metadata(
        metadata or {}, state))
    writer._tree, writer._order = tree, [leaf.path for leaf in leaves]
    sd = _dcp_state(leaves)
    fut = dcp.async_save(sd, storage_writer=writer, process_group=store._async_group)
    nbytes = sum(leaf.value.nbytes if not isinstance(leaf.value, torch.Tensor) else
                 leaf.value.numel() * leaf.value.element_size() for leaf in leaves)
    pending = PendingCommit(time.perf_counter() - t0, nbytes)
    future = getattr(fut, "upload_completion", fut)

    def done(f: Any) -> None:
        try:
            f.result()
            info = writer.last_commit or CommitInfo.from_manifest(
                store.manifest(writer._commit_id))
        except BaseException as e:  # noqa: BLE001 - handed to the caller through wait()
            pending._finish(None, e)
        else:
            pending._finish(info, None)

    store._committer._inflight = pending
    future.add_done_callback(done)
    return pending


def checkout_local(store: Any, m: Manifest, into: Any, paths: Sequence[str] | None) -> Any:
    """Load commit ``m`` into live state holding DTensors, reading on this rank only the
    chunks that overlap its shards: no collective, so one restarted rank recovers alone."""
    import torch.distributed.checkpoint as dcp

    from .state import load_into, select
    _, leaves = flatten(into)
    commit_paths = _tensor_paths(m.tree)
    want = {leaf.path: leaf for leaf in leaves if leaf.path in commit_paths}
    if paths:
        selected = _tensor_paths(select(m.tree, list(paths)))
        want = {p: leaf for p, leaf in want.items() if p in selected}
    missing = [p for p in commit_paths if p not in want and not paths]
    if missing:
        raise DistributedError(f"the live state lacks {len(missing)} tensors of commit "
                               f"{m.id[:10]} (e.g. {missing[0]!r}): load with paths= to restore "
                               "part of it")
    sd = _dcp_state(list(want.values()))
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": yes
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        with _unwrapped():
            dcp.load(sd, storage_reader=StorageReader(store, m.id), no_dist=True)
    tensors: list[Any] = [None] * len(m.tensors)
    for path, i in commit_paths.items():
        if path in sd:
            tensors[i] = want[path].value if isinstance(want[path].value, torch.Tensor) else sd[path]
    tree = select(m.tree, list(paths)) if paths else m.tree
    state = unflatten(tree, tensors)
    load_into(state, into)
    return state
