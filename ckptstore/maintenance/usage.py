"""Stored bytes per commit: its own data folder, and the data of other commits it reads (the
library behind ``ckpt du`` and the ``STORED`` column of ``ckpt show``).

Sizes come from listings of the store (one of the whole store, or one per data folder asked
about); which arrays a commit reads comes from :meth:`ckptstore.chains.walk.Walk.arrays_read`, so a
chain entry counts the base data it replays, once per commit however many entries share it.
Nothing here reads a tensor: sizes come from listings and dtype names, and ``ckpt du`` runs
without torch.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..chains.kinds import chain_kind
from ..chains.walk import StoredArray, Walk
from ..errors import CkptStoreError
from ..format.ids import commit_time, is_commit_id
from ..info import CommitInfo
from ..format.layout import COMMITS, DATA, data_dir, manifest_id, manifest_key
from ..history.manifest import Layout, TensorEntry
from ..progress import bar
from ..history.repository import Repository
from ..storage import Storage

if TYPE_CHECKING:
    from ..state.leaves import PlainValue

__all__ = ["CommitUsage", "StoredSizes", "UsageReport", "disk_usage", "entry_stored_bytes"]


class StoredSizes:
    """Stored bytes of ``data/<commit>/`` folders and of their arrays, from listings.

    Parameters
    ----------
    storage
        The store root.
    listing
        ``{key: size}`` of the whole store (``storage.walk_sizes("")``) when at hand; folders it
        does not hold are listed one by one when first asked about.
    """

    def __init__(self, storage: Storage, listing: Mapping[str, int] | None = None):
        self.storage = storage
        self._folders: dict[str, int] = {}
        self._arrays: dict[str, dict[str, int]] = {}
        for key, size in (listing or {}).items():
            self._add(key, size)

    def _add(self, key: str, size: int) -> None:
        parts = key.split("/")
        if len(parts) < 3 or parts[0] != DATA:
            return
        self._folders[parts[1]] = self._folders.get(parts[1], 0) + size
        arrays = self._arrays.setdefault(parts[1], {})
        if len(parts) >= 4:  # data/<commit>/<array>/...; data/<commit>/zarr.json is the group
            arrays[parts[2]] = arrays.get(parts[2], 0) + size

    def _list(self, commit: str) -> None:
        if commit not in self._folders:
            self._folders[commit] = 0
            self._arrays[commit] = {}
            for key, size in self.storage.walk_sizes(data_dir(commit)).items():
                self._add(key, size)

    def folder_bytes(self, commit: str) -> int:
        """Bytes under ``data/<commit>/`` (0 when there is no such folder)."""
        self._list(commit)
        return self._folders[commit]

    def array_bytes(self, commit: str, name: str) -> int | None:
        """Bytes of one array of a commit, or None when it is not in the store."""
        self._list(commit)
        return self._arrays[commit].get(name)

    def arrays_bytes(self, arrays: list[StoredArray]) -> int:
        """Bytes of stored arrays (missing ones count 0)."""
        return sum(self.array_bytes(a.commit, a.name) or 0 for a in arrays)

    def folders(self) -> dict[str, int]:
        """``{folder name: bytes}`` of every data folder listed so far."""
        return dict(self._folders)


def entry_stored_bytes(sizes: StoredSizes, e: TensorEntry,
                       shards: Sequence[TensorEntry] = ()) -> int | None:
    """What an entry itself stored: its array, the parts of a chain entry, or the arrays of a
    sharded tensor's pieces (``shards``: its manifest's); None for packed, alias and view entries,
    which store nothing of their own."""
    if e.layout == Layout.ARRAY:
        return sizes.array_bytes(e.commit, e.array)
    if e.layout == Layout.CHAIN:
        return sum(sizes.array_bytes(b.commit, b.array) or 0 for b in chain_kind(e.kind).reads(e))
    if e.layout == Layout.SHARDED and shards:
        own = [entry_stored_bytes(sizes, shards[p.entry]) for p in e.pieces or ()
               if p.entry < len(shards)]
        return sum(n for n in own if n is not None) if any(n is not None for n in own) else None
    return None


@dataclass(frozen=True)
class CommitUsage:
    """Stored bytes of one commit: ``own_bytes`` (its data folder), ``shared_bytes`` (arrays of
    the commits in ``reads`` it needs), ``total_bytes`` (what restoring it needs).

    ``error`` says why the manifest could not be read (time, step and message are then None).
    """

    id: str
    refs: tuple[str, ...]
    time: _dt.datetime | None
    step: PlainValue
    message: str | None
    own_bytes: int
    shared_bytes: int
    reads: tuple[str, ...]
    manifest_bytes: int
    error: str | None = None

    @property
    def total_bytes(self) -> int:
        return self.own_bytes + self.shared_bytes

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"id": self.id, "refs": list(self.refs),
                               "time": self.time.isoformat() if self.time else None,
                               "step": self.step, "message": self.message}
        if self.error is not None:
            doc["error"] = self.error
        doc.update(own_bytes=self.own_bytes, shared_bytes=self.shared_bytes,
                   reads=list(self.reads), manifest_bytes=self.manifest_bytes,
                   total_bytes=self.total_bytes)
        return doc


@dataclass(frozen=True)
class UsageReport:
    """What ``ckpt du`` prints: a row per commit, newest first, and totals.

    ``leftover_data`` holds ``(id, bytes)`` of data folders without a manifest (crashed commits,
    removed by gc); ``data_bytes`` counts each data folder or array the listed commits need once;
    ``store_bytes`` is every file of the store (None when only a ref's history was asked for).
    """

    commits: tuple[CommitUsage, ...]
    leftover_data: tuple[tuple[str, int], ...]
    data_bytes: int
    manifest_bytes: int
    store_bytes: int | None

    @property
    def total_bytes(self) -> int:
        """Data and manifests that keeping the listed commits needs."""
        return self.data_bytes + self.manifest_bytes

    def to_json(self) -> dict[str, Any]:
        return {"commits": [c.to_json() for c in self.commits],
                "leftover_data": [{"id": d, "own_bytes": n} for d, n in self.leftover_data],
                "data_bytes": self.data_bytes, "manifest_bytes": self.manifest_bytes,
                "total_bytes": self.total_bytes, "store_bytes": self.store_bytes}


def _commit_usage(repo: Repository, walk: Walk, sizes: StoredSizes, c: str, refs: list[str],
                  manifest_bytes: int) -> tuple[CommitUsage, list[StoredArray]]:
    """One commit's row, and the arrays of other commits it reads."""
    try:
        m = repo.manifest(c)
        info = CommitInfo.from_manifest(m)
        shared = [a for a in walk.arrays_read(m) if a.commit != c]
        known: dict[str, Any] = {"time": info.time, "step": info.step, "message": info.message}
    except CkptStoreError as e:
        shared = []
        known = {"time": None, "step": None, "message": None, "error": str(e)}
    row = CommitUsage(id=c, refs=tuple(refs), own_bytes=sizes.folder_bytes(c),
                      shared_bytes=sizes.arrays_bytes(shared),
                      reads=tuple(sorted({a.commit for a in shared})),
                      manifest_bytes=manifest_bytes, **known)
    return row, shared


def disk_usage(repo: Repository, ref: str | None = None, limit: int | None = None,
               progress: bool = False) -> UsageReport:
    """Stored bytes per commit, newest first.

    Parameters
    ----------
    repo
        The store's history (``store.repo``).
    ref
        Only the history of ``ref`` (first parents); default: every commit in the store, from one
        listing of it, with leftover data folders and the size of the whole store.
    limit
        At most this many commits.
    progress
        Show a progress bar (commits measured) on stderr.

    Returns
    -------
    UsageReport
    """
    storage = repo.storage
    manifest_bytes: dict[str, int] = {}
    store_bytes: int | None = None
    if ref is None:
        listing = storage.walk_sizes("")
        store_bytes = sum(listing.values())
        for key, n in listing.items():
            parts = key.split("/")
            c = manifest_id(parts[1]) if len(parts) == 2 and parts[0] == COMMITS else None
            if c is not None:
                manifest_bytes[c] = n
        ids = sorted(manifest_bytes, key=commit_time, reverse=True)[:limit]
        sizes = StoredSizes(storage, listing)
    else:
        ids = [info.id for info in repo.iter_log(ref, limit=limit)]
        sizes = StoredSizes(storage)
    listed = set(ids)
    names = repo.ref_names()
    walk = Walk(repo.manifest)
    rows: list[CommitUsage] = []
    outside: dict[tuple[str, str], StoredArray] = {}  # arrays of unlisted commits listed ones read
    with bar(len(ids), "du", progress and bool(ids), unit="commit") as shown:
        for c in ids:
            if c not in manifest_bytes:
                manifest_bytes[c] = storage.size(manifest_key(c))
            row, shared = _commit_usage(repo, walk, sizes, c, names.get(c, []),
                                        manifest_bytes[c])
            rows.append(row)
            outside.update((a.ident, a) for a in shared if a.commit not in listed)
            shown.update()
    data = sum(sizes.folder_bytes(c) for c in ids) + sizes.arrays_bytes(list(outside.values()))
    leftovers = () if ref is not None else tuple(
        (d, n) for d, n in sorted(sizes.folders().items())
        if d not in manifest_bytes and is_commit_id(d))
    return UsageReport(commits=tuple(rows), leftover_data=leftovers, data_bytes=data,
                       manifest_bytes=sum(manifest_bytes[c] for c in ids),
                       store_bytes=store_bytes)
