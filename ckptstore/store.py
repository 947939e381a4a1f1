"""The Store facade: commit, checkout, history, refs, gc and verify over one store root."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .errors import ManifestError, NotAStoreError, RefExists
from .gc import collect
from .ids import new_commit_id
from .incremental import ChainMemory
from .info import CommitInfo, GCResult, VerifyReport
from .layout import MARKER, check_ref_name, tag_key
from .manifest import Manifest, decode_marker, encode_marker
from .pending import PendingCommit
from .plan import EncodingOptions, plan_commit
from .policy import Policy
from .reader import Reader
from .records import build_manifest
from .repository import Repository
from .staging import StagingPool
from .state import flatten, load_into, select, tree_paths, unflatten
from .storage import Storage, open_storage
from .verify import verify
from .writer import persist, snapshot

__all__ = ["Store", "open"]


@dataclass
class _Job:
    """A planned commit between its snapshot and its persist."""

    branch: str
    tags: list[str]
    message: str
    metadata: dict[str, Any]
    tree: Any
    plan: Any
    tip: Any
    parent: Manifest | None
    tracker: Any


class Store:
    """A versioned checkpoint store (use :func:`ckptstore.open`)."""

    def __init__(self, storage: Storage, options: EncodingOptions | None = None,
                 io_workers: int | None = None, policy: Policy | None = None):
        self.repo = Repository(storage, io_workers)
        self.storage = storage
        self.refs = self.repo.refs
        self.options = options or EncodingOptions()
        self.policy = policy or Policy()
        self._chains = ChainMemory()
        self._executor = self.repo.executor
        workers = self.repo.io_workers
        # encoded chunks in memory at once: enough to keep the workers busy, at most ~64 MiB
        self._max_inflight = max(2, min(2 * workers, (64 << 20) // self.options.chunk_bytes))
        self._staging = StagingPool()
        self._persister = ThreadPoolExecutor(1, thread_name_prefix="ckptstore-persist")
        self._inflight: PendingCommit | None = None

    def __repr__(self) -> str:
        return f"<ckptstore.Store {self.storage.url!r}>"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Wait for a commit in flight, then release the store's worker threads.

        Raises :class:`PendingCommitError` if the last asynchronous commit failed unobserved.
        """
        try:
            self._wait_inflight()
        finally:
            self._persister.shutdown(wait=True)
            self.repo.close()
            self._staging.clear()

    # -- commit ----------------------------------------------------------------------------
    def commit(self, state: Any, message: str = "", branch: str = "main",
               tags: Sequence[str] = (), metadata: dict[str, Any] | None = None,
               policy: Policy | None = None, tracker: Any = None) -> CommitInfo:
        """Store ``state`` as a new commit on ``branch`` and return its :class:`CommitInfo`.

        ``state`` is an ``nn.Module``, a state dict, or a mapping of names to objects with
        ``state_dict()``/``load_state_dict()`` and plain values. ``policy`` (default: the
        store's) chooses full, incremental or delta entries and quantization per tensor;
        ``tracker`` (:func:`ckptstore.track`) supplies the touched rows of embedding tables.

        The steps: flatten -> plan -> snapshot -> persist (data) -> manifest -> ref. Until the ref
        moves nothing is visible; if another writer moved the branch meanwhile,
        :class:`ConcurrentUpdateError` is raised and the commit stays stored (unreferenced) until
        gc.
        """
        self._wait_inflight()
        job = self._prepare(state, message, branch, tags, metadata, policy, tracker)
        snap = snapshot(job.plan)                                            # 3. snapshot
        if tracker is not None:
            tracker.clear()  # rows seen so far are in the plan (kept as unsaved until the ref moves)
        return self._finish(job, snap)

    def commit_async(self, state: Any, message: str = "", branch: str = "main",
                     tags: Sequence[str] = (), metadata: dict[str, Any] | None = None,
                     policy: Policy | None = None, tracker: Any = None,
                     staged: bool = False) -> PendingCommit:
        """Capture ``state`` now and persist it in the background (CheckFreq's two phases).

        Returns once every tensor is copied into reusable host staging buffers (pinned, with
        non-blocking copies on a side stream for CUDA tensors): the caller may then modify the
        model. At most one commit is in flight: this waits for the previous one first, and
        raises :class:`PendingCommitError` if it failed unobserved. ``staged=True`` takes the
        state as an already-made snapshot (e.g. a dict of pinned CPU tensors nobody modifies
        until ``wait()`` returns) and copies nothing.
        """
        t0 = time.perf_counter()  # the stall includes waiting for the previous persist
        self._wait_inflight()
        job = self._prepare(state, message, branch, tags, metadata, policy, tracker)
        snap = snapshot(job.plan, None if staged else self._staging)
        if tracker is not None:
            tracker.clear()
        pending = PendingCommit(time.perf_counter() - t0, snap.nbytes)

        def run() -> None:
            try:
                info = self._finish(job, snap, pending.progress)
            except BaseException as e:  # noqa: BLE001 - handed to the caller through wait()
                pending._finish(None, e)
            else:
                pending._finish(info, None)

        self._inflight = pending
        self._persister.submit(run)
        return pending

    def _wait_inflight(self) -> None:
        pending = self._inflight
        if pending is not None:
            pending._done.wait()
            pending.raise_unobserved()

    def _prepare(self, state: Any, message: str, branch: str, tags: Sequence[str],
                 metadata: dict[str, Any] | None, policy: Policy | None,
                 tracker: Any) -> _Job:
        check_ref_name(branch, "branch")
        tags = [check_ref_name(t, "tag") for t in ([tags] if isinstance(tags, str) else tags)]
        for t in tags:
            if self.storage.exists(tag_key(t)):
                raise RefExists(f"tag {t!r} already exists; choose another name")
        metadata = _plain_metadata(metadata or {}, state)
        policy = self._effective_policy(policy or self.policy)
        tree, leaves = flatten(state)                                        # 1. flatten
        tip = self.refs.tip(branch)
        parent = self.manifest(tip[1]) if tip else None
        decide = self._chains.decider(policy, branch, parent, tracker)
        plan = plan_commit(leaves, self.options, decide)                     # 2. plan
        return _Job(branch, tags, message, metadata, tree, plan, tip, parent, tracker)

    def _finish(self, job: _Job, snap: Any, progress: Any = None) -> CommitInfo:
        commit_id = new_commit_id()
        done = persist(self.storage, commit_id, job.plan, snap, self._executor,  # 4. persist
                       self._max_inflight, self.options.chunk_bytes, progress)
        manifest = build_manifest(commit_id, job.parent, job.message, job.metadata, job.tree,
                                  job.plan, done)
        self.repo.write_manifest(manifest)                                 # 5. manifest
        self.refs.advance(job.branch, job.tip, commit_id)                   # 6. ref
        tracker = job.tracker
        self._chains.commit_done(job.branch, commit_id, job.plan, snap, done,
                                 lambda t: tracker is not None and tracker.lookup(t) is not None)
        for t in job.tags:
            try:
                self.refs.create_tag(t, commit_id)
            except RefExists:
                raise RefExists(f"commit {commit_id} was made on {job.branch!r}, but another "
                                f"writer created tag {t!r} meanwhile; do not commit again -- tag "
                                f"this commit with another name") from None
        return CommitInfo.from_manifest(manifest)

    def _effective_policy(self, policy: Policy) -> Policy:
        if policy.bitwidth is not None:
            return policy.with_bits(policy.bitwidth.bits(self.restore_count()))
        return policy

    def rebase(self, ref: str = "main", branch: str | None = None,
               message: str = "") -> CommitInfo:
        """Write the state of ``ref`` as a new full, lossless commit on ``branch`` (default: ``ref``
        when it is a branch, else ``main``), so that gc can collect the chains before it."""
        commit_id = self.resolve(ref)
        branch = branch or (ref if ref in self.refs.branches() else "main")
        m = self.manifest(commit_id)
        state = self.checkout(commit_id)
        return self.commit(state, message=message or f"rebase of {commit_id[:10]}",
                           branch=branch, metadata=dict(m.metadata), policy=Policy())

    # -- restores ----------------------------------------------------------------------------
    def record_restore(self, commit_id: str) -> None:
        """Count one resume of training from a commit (drives :class:`~ckptstore.policy.BitWidth`)."""
        self.repo.record_restore(commit_id)

    def restore_count(self) -> int:
        """How many times training resumed from this store (``checkout(..., for_resume=True)``)."""
        return self.repo.restore_count()

    # -- checkout --------------------------------------------------------------------------
    def checkout(self, ref: str = "main", *, into: Any = None,
                 paths: Sequence[str] | None = None, map_location: Any = None,
                 for_resume: bool = False) -> Any:
        """Rebuild the state of a commit.

        Parameters
        ----------
        ref
            Branch, tag, commit id or unique prefix, with ``~N`` / ``^`` ancestry.
        into
            An object with ``load_state_dict`` or a mapping ``{name: object}`` to load in place.
        paths
            Glob patterns of dotted paths (``"model.emb.*"``): only those entries are read.
        map_location
            Device to move tensors to (``"cpu"``, ``"cuda:0"``, ``torch.device``).
        for_resume
            Training resumes from this state: counted for the restore budget of quantized commits.
        """
        m = self.manifest(self.resolve(ref))
        tree = select(m.tree, list(paths)) if paths else m.tree
        wanted = [n["tensor"] for n in tree_paths(tree).values() if "tensor" in n]
        if any(not isinstance(i, int) or not 0 <= i < len(m.tensors) for i in wanted):
            raise ManifestError(f"commit {m.id} refers to tensors it does not have")
        reader = Reader(self.storage, self.manifest, self._executor)
        got = reader.read_tensors(m, wanted, map_location)
        tensors = [got.get(i) for i in range(len(m.tensors))]
        state = unflatten(tree, tensors)
        if into is not None:
            self._wait_inflight()  # its references must not outlive this load
            self._chains.forget()  # live tensors change behind any tracker: rebase next time
            load_into(state, into)
        if for_resume:
            self.record_restore(m.id)
        return state

    # -- history and refs ------------------------------------------------------------------
    def manifest(self, commit_id: str) -> Manifest:
        """The validated manifest of a commit (cached; manifests are immutable)."""
        return self.repo.manifest(commit_id)

    def forget(self, commit_id: str) -> None:
        """Drop a commit from the manifest cache (after gc removed it)."""
        self.repo.forget(commit_id)

    def commit_ids(self) -> list[str]:
        """Ids of every commit manifest in the store (reachable or not)."""
        return self.repo.commit_ids()

    def resolve(self, ref: str) -> str:
        """Commit id of a branch, tag, commit id, unique id prefix, with ``~N`` / ``^N``."""
        return self.repo.resolve(ref)

    def log(self, ref: str = "main", limit: int | None = None) -> list[CommitInfo]:
        """History from ``ref`` back along first parents, newest first."""
        return list(self.iter_log(ref, limit))

    def iter_log(self, ref: str = "main", limit: int | None = None) -> Iterator[CommitInfo]:
        """History from ``ref`` back along first parents, newest first (lazily)."""
        return self.repo.iter_log(ref, limit)

    def info(self, ref: str) -> CommitInfo:
        return CommitInfo.from_manifest(self.manifest(self.resolve(ref)))

    def tag(self, name: str, ref: str = "main") -> str:
        """Create tag ``name`` at ``ref``; raises :class:`RefExists` if it exists."""
        check_ref_name(name, "tag")
        commit_id = self.resolve(ref)
        self.refs.create_tag(name, commit_id)
        return commit_id

    def delete_tag(self, name: str) -> None:
        self.refs.delete_tag(name)

    def tags(self) -> dict[str, str]:
        return self.refs.tags()

    def branch(self, name: str, ref: str = "main") -> str:
        """Create branch ``name`` at ``ref`` (a commit id of an orphan works too)."""
        check_ref_name(name, "branch")
        commit_id = self.resolve(ref)
        self.refs.create_branch(name, commit_id)
        return commit_id

    def reset_branch(self, name: str, ref: str) -> str:
        """Move an existing branch to ``ref``."""
        commit_id = self.resolve(ref)
        self.refs.reset_branch(name, commit_id)
        return commit_id

    def delete_branch(self, name: str) -> None:
        self.refs.delete_branch(name)
        self._chains.forget(name)

    def branches(self) -> dict[str, str]:
        return self.refs.branches()

    # -- maintenance -----------------------------------------------------------------------
    def gc(self, keep_last: int | None = None, keep_tags: bool = True,
           keep_every: int | None = None, dry_run: bool = False,
           grace_period: float = 3600.0) -> GCResult:
        """Remove old commits and leftovers; see :func:`ckptstore.gc.collect`."""
        self._wait_inflight()  # never collect the data of our own commit in flight
        return collect(self.repo, keep_last=keep_last, keep_tags=keep_tags, keep_every=keep_every,
                       dry_run=dry_run, grace_period=grace_period)

    def verify(self, ref: str | None = None, progress: bool = False) -> VerifyReport:
        """Check every chunk (existence and checksum) of ``ref``'s commit, or of every commit
        reachable from a branch or tag."""
        return verify(self.repo, ref, progress=progress)

    def reachable(self, roots: Iterable[str] | None = None) -> list[str]:
        """Commits reachable from branch tips and tags (or from ``roots``), newest first."""
        return self.repo.reachable(roots)


def _plain_metadata(metadata: dict[str, Any], state: Any) -> dict[str, Any]:
    out = dict(metadata)
    if isinstance(state, dict):
        for key in ("step", "epoch"):
            if key in state and key not in out and isinstance(state[key], (int, float)):
                out[key] = state[key]
    for k, v in out.items():
        if not isinstance(k, str) or not isinstance(v, (type(None), bool, int, float, str)):
            raise TypeError(f"metadata[{k!r}] must be a str key with a plain value "
                            "(None, bool, int, float, str)")
    return out


def open(url: str | os.PathLike, create: bool = True, options: EncodingOptions | None = None,
         policy: Policy | None = None, io_workers: int | None = None, durable: bool = False,
         **storage_options: Any) -> Store:
    """Open the store at ``url`` (a local path or any fsspec URL), creating it unless
    ``create=False``. ``durable=True`` fsyncs every chunk file of a local store before the
    manifest is written (survives power loss, at a cost in write throughput). ``io_workers`` bounds the threads that encode and write chunks (default:
    the CPU count on local disks, 16 for object stores); lower it to leave cores to training.

    Raises :class:`NotAStoreError` if the location exists but holds something else, or is absent
    and ``create=False``; :class:`FormatVersionError` if a newer ckptstore wrote it.
    """
    storage = open_storage(url, durable=durable, **storage_options)
    try:
        decode_marker(storage.read(MARKER), storage.path(MARKER))
    except FileNotFoundError:
        if not create:
            raise NotAStoreError(f"no ckptstore at {url!s}: check the location (a store is "
                                 "created by ckptstore.open(url) without create=False)") from None
        leftovers = [n for n in storage.listdir("") if not n.startswith(".")]
        if leftovers:
            raise NotAStoreError(
                f"{url!s} is not empty ({', '.join(leftovers[:5])}) and holds no ckptstore; "
                "choose an empty location") from None
        storage.put_if_absent(MARKER, encode_marker())
        decode_marker(storage.read(MARKER), storage.path(MARKER))
    return Store(storage, options, io_workers=io_workers, policy=policy)
