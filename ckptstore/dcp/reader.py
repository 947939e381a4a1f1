"""``StorageReader``: ``dcp.load`` from a commit of a ckptstore, resharding as DCP plans it.

Metadata comes from the manifest; each rank reads only the chunks that overlap what it asks for;
non-tensor values are handed to DCP as bytes made here from the manifest's plain values, after
``torch.load(weights_only=True)`` accepted them.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TYPE_CHECKING

import numpy as np
import torch
from torch.distributed.checkpoint import storage as dcp_storage
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,
                                                   Metadata, MetadataIndex, TensorProperties,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner

from ..format.arrays import host_to_tensor, start_read_region, torch_dtype, writable_host_view
from ..chains.walk import entry_array
from ..chunkcodec import codec_from_config
from ..errors import DistributedError, ManifestError
from ..history.manifest import Layout, Manifest, TensorEntry
from ..checkout.reader import Reader
from ..state.tree import Tree, tree_paths, unflatten

if TYPE_CHECKING:
    from ..store import Store

__all__ = ["StorageReader"]

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

    def __init__(self, store: Store, ref: str = "main"):
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
        self._values, keys = _value_paths(m.tree)
        for path in self._values:
            state[path] = BytesStorageMetadata()
        return Metadata(state_dict_metadata=state, storage_data=storage,
                        planner_data={p: keys[p] for p in state})

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
        items = _resolved(m, plan, self._storage)
        reader.check_stored(entry_array(src) for _, _, src in items  # all listings at once
                            if src is not None and src.layout == Layout.ARRAY and src.shape)
        for req, loc, src in items:
            if src is None:
                planner.load_bytes(req, _safe_bytes(self._values, req.storage_index.fqn))
                continue
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


def _properties(e: TensorEntry) -> TensorProperties:
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


def _resolved(m: Manifest, plan: LoadPlan, located: dict) -> list[tuple[Any, Any, Any]]:
    """``(request, location, entry holding its block)`` of every request of the plan;
    ``(request, None, None)`` for plain values."""
    out: list[tuple[Any, Any, Any]] = []
    for req in plan.items:
        if req.type == LoadItemType.BYTE_IO:
            out.append((req, None, None))
            continue
        loc = located.get(req.storage_index)
        if not isinstance(loc, _Located):
            raise ManifestError(f"commit {m.id} has no chunk {req.storage_index}")
        out.append((req, loc, _source(m, m.tensors[loc.tensor], loc)))
    return out


def _queue_block(reader: Reader, src: TensorEntry, offsets: Sequence[int],
                 lengths: Sequence[int], target: torch.Tensor) -> list[Any]:
    """Queue the chunk reads of a block of an ``array`` entry, each copied into ``target``."""
    if any(o < 0 or o + n > s for o, n, s in zip(offsets, lengths, src.shape)) or len(
            offsets) != len(src.shape):
        raise ManifestError(f"a read of {src.path!r} reaches outside its shape {src.shape}")
    a = entry_array(src)
    reader.check_stored([a])  # one listing, not a GET per chunk of a hostile grid (done
    # already for a whole plan by read_data)
    # straight copies of the bits only into a target of the stored dtype (bfloat16 and uint16
    # share numpy's uint16: other dtypes convert through torch's copy_)
    view = writable_host_view(target) if target.dtype == torch_dtype(src.dtype) else None

    def put(row: int, part: np.ndarray) -> None:
        if view is not None:  # straight from the chunk (a view of the read bytes, raw) to place
            np.copyto(view[row: row + part.shape[0]], part)
        else:
            target[row: row + part.shape[0]].copy_(host_to_tensor(np.array(part), src.dtype))

    return start_read_region(reader.repo.storage, a.prefix, a.grid, a.dtype,
                             codec_from_config(a.codec), reader.repo.executor, offsets, lengths,
                             put, into=view)


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
    return {p: n["tensor"] for p, n in tree_paths(tree).items() if "tensor" in n}


def _value_paths(tree: Tree) -> tuple[dict[str, Tree], dict[str, tuple[Any, ...]]]:
    """Every subtree that holds no tensor, by dotted path (DCP asks for a non-tensor value at
    whatever depth its own flattening stopped: a whole ``param_groups`` list, say); and the key
    path of each such value and of each tensor (DCP's ``planner_data``: dict keys as strings,
    list indices as ints, as DCP's own flattening records them), which
    ``_load_state_dict_from_keys`` nests its result by."""
    out: dict[str, Tree] = {}
    keys: dict[str, tuple[Any, ...]] = {}

    def walk(node: Any, path: str, key: tuple[Any, ...]) -> bool:  # True if it holds a tensor
        if not isinstance(node, dict):
            raise ManifestError(f"invalid state tree node at {path or '<root>'!r}")
        if "tensor" in node:
            keys[path] = key
            return True
        children: list[tuple[str, Any, Any]] = []
        for kind in ("dict", "odict"):
            if kind in node and isinstance(node[kind], list):
                pairs = (p for p in node[kind] if isinstance(p, list) and len(p) == 2)
                children = [(str(k), str(k), v) for k, v in pairs]
        for kind in ("list", "tuple"):
            if kind in node and isinstance(node[kind], list):
                children = [(str(i), i, v) for i, v in enumerate(node[kind])]
        has = False
        for name, k, v in children:
            has |= walk(v, f"{path}.{name}" if path else name, (*key, k))
        if not has and path:
            out[path] = node
            keys[path] = key
        return has

    walk(tree, "", ())
    return out, keys


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
        with torch.serialization.safe_globals([io.BytesIO]):  # a BytesIO value: its bytes
            torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:  # noqa: BLE001 - any refusal of the safe loader
        raise DistributedError(f"the value at {fqn!r} is not a plain value that loads without "
                               f"unpickling arbitrary objects: {e}") from None
    return io.BytesIO(data)
