"""History and refs of one store: storage, refs, immutable manifests (cached), the I/O pool.

The :class:`Repository` is what everything that reads history takes -- gc, verify, the reader,
usage, diff, export -- instead of the :class:`~ckptstore.store.Store` facade, which adds the act of
committing (:mod:`ckptstore.commit.committer`) on top of it. (The CLI opens a Store, since some verbs
commit, and hands ``store.repo`` to the read-only library calls.)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator

from ..errors import AmbiguousRef, CkptStoreError, ManifestError, RefNotFound
from ..format.ids import is_commit_id, new_commit_id
from ..info import CommitInfo
from ..format.layout import COMMITS, RESTORES, check_ref_name, manifest_id, manifest_key, restore_key
from .manifest import Manifest, decode_manifest, encode_manifest
from .summary import Summary
from ..priority import started_executor
from .refs import Refs
from .revparse import HEX_PREFIX_RE, history_loop, parse_revision
from ..storage import Storage

__all__ = ["CACHED_ENTRIES", "CACHED_MANIFESTS", "CACHED_SUMMARIES", "MIN_CACHED",
           "Repository"]

#: the manifest cache keeps at most this many manifests ...
CACHED_MANIFESTS = 512
#: ... and, beyond the newest MIN_CACHED, at most this many entries (tensors, storages, shards,
#: packs) in all: a decoded entry takes ~4 KB and a dozen Python objects, which every full
#: garbage collection of the training process walks (512 manifests of 300 tensors held 600 MB
#: and made each full collection 4.5x longer)
CACHED_ENTRIES = 16_384
#: the newest manifests kept whatever their size (a commit reads its parent's, a chain's
#: checkout its links')
MIN_CACHED = 4
#: commit summaries cached (history walks and retention read these, not manifests): a few
#: hundred bytes each
CACHED_SUMMARIES = 65_536


def _entries(m: Manifest) -> int:
    return 1 + len(m.tensors) + len(m.storages) + len(m.shards) + len(m.packs)


class Repository:
    """Refs, manifests and the chunk I/O thread pool of one store root.

    Parameters
    ----------
    storage
        The store root.
    io_workers
        Threads that encode, write and read chunks (default: the CPU count on local disks, at
        least 16 for object stores, where requests wait on the network).
    """

    def __init__(self, storage: Storage, io_workers: int | None = None):
        self.storage = storage
        self.refs = Refs(storage)
        self.io_workers = io_workers or storage.io_threads
        # every thread started now, from the opener's thread: a thread inherits its creator's
        # CPU priority (priority.py's fact; storage only says how many threads suit it)
        self.executor = started_executor(self.io_workers, "ckptstore-io")
        self._manifests: OrderedDict[str, Manifest] = OrderedDict()
        self._cached_entries = 0
        self._summaries: OrderedDict[str, Summary] = OrderedDict()
        self._lock = threading.Lock()

    def close(self) -> None:
        """Release the I/O threads."""
        self.executor.shutdown(wait=True)

    # -- manifests -------------------------------------------------------------------------
    def manifest(self, commit_id: str, fresh: bool = False) -> Manifest:
        """The validated manifest of a commit (cached; manifests are immutable). ``fresh``: a
        cached one only while the store still holds it (another process's gc may have removed
        it: history and revisions say what exists now)."""
        key = manifest_key(commit_id)
        with self._lock:
            cached = self._manifests.get(commit_id)
            if cached is not None:
                self._manifests.move_to_end(commit_id)
        if cached is not None and (not fresh or self.storage.exists(key)):
            return cached
        try:
            data = self.storage.read(key)
        except FileNotFoundError:
            self.forget(commit_id)
            raise RefNotFound(f"commit {commit_id} is not in the store (removed by gc?)") from None
        m = decode_manifest(data, key)
        if m.id != commit_id:
            raise ManifestError(f"{key} holds commit {m.id}, not {commit_id}")
        self.remember(m)
        return m

    def summary(self, commit_id: str, fresh: bool = False) -> Summary:
        """What history walks read of a commit (:class:`Summary`; cached apart from the
        manifests, by the ten thousand). ``fresh`` as in :meth:`manifest`."""
        with self._lock:
            cached = self._summaries.get(commit_id)
            if cached is not None:
                self._summaries.move_to_end(commit_id)
        if cached is not None and (not fresh or self.storage.exists(manifest_key(commit_id))):
            return cached
        m = self.manifest(commit_id, fresh)  # remembers its summary, unless cached already
        with self._lock:
            cached = self._summaries.get(commit_id)
        return cached if cached is not None else Summary.of(m)

    def write_manifest(self, m: Manifest) -> None:
        """Store a new commit's manifest (put-if-absent: manifests are never overwritten)."""
        self.storage.put_if_absent(manifest_key(m.id), encode_manifest(m))
        self.remember(m)

    def remember(self, m: Manifest) -> None:
        """Cache ``m``, the least recently used manifests making room (see
        :data:`CACHED_ENTRIES`)."""
        summary = Summary.of(m)
        with self._lock:
            self._summaries[m.id] = summary
            self._summaries.move_to_end(m.id)
            while len(self._summaries) > CACHED_SUMMARIES:
                self._summaries.popitem(last=False)
            old = self._manifests.pop(m.id, None)
            self._cached_entries += _entries(m) - (_entries(old) if old is not None else 0)
            self._manifests[m.id] = m
            while len(self._manifests) > MIN_CACHED and (
                    len(self._manifests) > CACHED_MANIFESTS
                    or self._cached_entries > CACHED_ENTRIES):
                self._cached_entries -= _entries(self._manifests.popitem(last=False)[1])

    def forget(self, commit_id: str) -> None:
        """Drop a commit from the manifest cache (after gc removed it)."""
        with self._lock:
            self._summaries.pop(commit_id, None)
            old = self._manifests.pop(commit_id, None)
            if old is not None:
                self._cached_entries -= _entries(old)

    @property
    def cached_manifests(self) -> tuple[int, int]:
        """(manifests, entries) in the manifest cache now."""
        with self._lock:
            return len(self._manifests), self._cached_entries

    def commit_ids(self) -> list[str]:
        """Ids of every commit manifest in the store (reachable or not)."""
        return [c for c in map(manifest_id, self.storage.listdir(COMMITS)) if c is not None]

    # -- revisions -------------------------------------------------------------------------
    def resolve(self, ref: str) -> str:
        """Commit id of a branch, tag, commit id, unique id prefix, with ``~N`` / ``^``."""
        rev = parse_revision(ref)
        return rev.walk(self._resolve_name(rev.name), lambda c: self.summary(c, fresh=True).parent,
                        ref)

    def _resolve_name(self, name: str) -> str:
        try:
            check_ref_name(name)
        except ValueError:
            if not HEX_PREFIX_RE.fullmatch(name):
                raise RefNotFound(f"no branch, tag or commit {name!r}") from None
        else:
            tip = self.refs.tip(name)
            if tip is not None:
                return tip[1]
            try:
                return self.refs.tag(name)
            except RefNotFound:
                pass
        if HEX_PREFIX_RE.fullmatch(name):
            if is_commit_id(name) and self.storage.exists(manifest_key(name)):
                return name
            hits = [c for c in self.commit_ids() if c.startswith(name)]
            if len(hits) == 1:
                return hits[0]
            if len(hits) > 1:
                raise AmbiguousRef(f"commit prefix {name!r} matches {len(hits)} commits: "
                                   f"{', '.join(h[:12] for h in hits[:5])}; give more digits")
        raise RefNotFound(f"no branch, tag or commit {name!r} (branches: "
                          f"{', '.join(sorted(self.refs.branches())) or 'none'})")

    def ref_names(self) -> dict[str, list[str]]:
        """``{commit id: ["main", "tag: v1"]}``: the branches, then the tags, at each commit."""
        out: dict[str, list[str]] = {}
        for name, c in sorted(self.refs.branches().items()):
            out.setdefault(c, []).append(name)
        for name, c in sorted(self.refs.tags().items()):
            out.setdefault(c, []).append(f"tag: {name}")
        return out

    # -- history ---------------------------------------------------------------------------
    def iter_log(self, ref: str = "main", limit: int | None = None) -> Iterator[CommitInfo]:
        """History from ``ref`` back along first parents, newest first (stops where gc cut)."""
        commit_id: str | None = self.resolve(ref)
        n, seen = 0, set()
        while commit_id is not None and (limit is None or n < limit):
            try:
                m = self.summary(commit_id, fresh=True)
            except RefNotFound:
                if n == 0:  # gc never removes what a ref names: the ref itself is damaged
                    raise RefNotFound(f"{ref!r} names commit {commit_id}, which is not in the "
                                      "store: its ref file is damaged; point it at a good commit "
                                      "(store.reset_branch) or restore it") from None
                return  # older history was removed by gc
            yield CommitInfo.from_summary(m)
            seen.add(commit_id)
            if m.parent in seen:
                raise history_loop(commit_id, m.parent)
            commit_id, n = m.parent, n + 1

    def reachable(self, roots: Iterable[str] | None = None, broken: bool = False) -> list[str]:
        """Commits reachable from branch tips and tags (or from ``roots``), newest first.

        A manifest that does not validate raises its :class:`ManifestError`; with
        ``broken=True`` its commit is listed and its line ends there (verify reports it)."""
        roots = list(roots) if roots is not None else [
            *self.refs.branches().values(), *self.refs.tags().values()]
        seen: dict[str, None] = {}
        for c in roots:
            while c is not None and c not in seen:
                try:
                    m = self.summary(c)
                except RefNotFound:
                    break
                except CkptStoreError:
                    if not broken:
                        raise
                    seen[c] = None
                    break
                seen[c] = None
                c = m.parent
        return list(seen)

    # -- restores --------------------------------------------------------------------------
    def record_restore(self, commit_id: str) -> None:
        """Count one resume of training from a commit (drives the restore-driven bit width)."""
        self.storage.put_if_absent(restore_key(new_commit_id()), (commit_id + "\n").encode())

    def restore_count(self) -> int:
        """How many times training resumed from this store."""
        return sum(1 for n in self.storage.listdir(RESTORES) if is_commit_id(n))
