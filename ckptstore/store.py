"""The Store facade: the verbs of a checkpoint store, each a call into the layer that does it.

History and refs live in :class:`~ckptstore.history.repository.Repository`, the act of writing in
:class:`~ckptstore.commit.committer.Committer`, reading in :class:`~ckptstore.checkout.reader.Reader`,
maintenance in :mod:`ckptstore.maintenance.gc` and :mod:`ckptstore.maintenance.verify`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

from .checkout.flow import checkout
from .commit.committer import Committer
from .commit.auto import committer_for, process_group
from .commit.process import WorkerSpec
from .commit.pipeline import Metadata
from .maintenance.diff import DiffResult, diff
from .maintenance.gc import collect
from .errors import TierError
from .info import CommitInfo, GCResult, VerifyReport
from .format.layout import check_ref_name
from .checkout.batches import iter_tensors
from .state.leaves import BATCH_BYTES, TensorLike
from .history.manifest import Manifest
from .commit.pending import PendingCommit
from .commit.plan import EncodingOptions
from .policy import Policy
from .policy.retention import Retention, check_retention
from .priority import DEFAULT_PRIORITY, check_priority
from .progress import bar
from .history.repository import Repository
from .storage import Storage
from .tiers import MirroredRefs, Tiers, Upload
from .tracking.rows import RowTracker
from .maintenance.usage import UsageReport, disk_usage
from .maintenance.verify import verify

__all__ = ["Store", "open"]


class Store:
    """A versioned checkpoint store (use :func:`ckptstore.open`)."""

    def __init__(self, storage: Storage, options: EncodingOptions | None = None,
                 io_workers: int | None = None, policy: Policy | None = None,
                 collective: bool = True, staging_budget: int | None = None,
                 background_priority: str = DEFAULT_PRIORITY, keep: Retention | None = None,
                 tiers: Tiers | None = None, worker: WorkerSpec | None = None):
        check_priority(background_priority)
        check_retention(keep)
        self.tiers = tiers  # open(url, local=...): the local tier, the journal, the uploads
        self.repo = Repository(storage, io_workers)
        self.storage = storage
        # a tiered store replays branch and tag changes on its remote, in upload order
        self.refs = self.repo.refs if tiers is None else MirroredRefs(storage, tiers)
        self.options = options or EncodingOptions()
        self.policy = policy or Policy()
        self._committer = committer_for(self.repo, self.options, self.policy, staging_budget,
                                        background_priority, worker)
        self._committer.retention = keep  # applied after each commit lands
        self.collective = collective

    def __repr__(self) -> str:
        return f"<ckptstore.Store {self.storage.url!r}>"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Wait for a commit in flight, then release the store's worker threads and persist
        process; :class:`PendingCommitError` if the last asynchronous commit failed unobserved."""
        try:
            self._committer.close()
        finally:
            if self.tiers is not None:
                self.tiers.close()  # uploads left stay in the journal for the next open
            self.repo.close()

    @property
    def committer(self) -> Committer:
        """The store's commit pipeline (:class:`~ckptstore.commit.committer.Committer`), which
        the distributed paths drive."""
        return self._committer

    @property
    def staging_bytes(self) -> int:
        """Host bytes held by the reusable staging buffers of ``commit_async``."""
        return self._committer.staging_nbytes

    @property
    def staging_device_bytes(self) -> int:
        """Accelerator bytes of ``commit_async``'s device staging buffers (device_encode=)."""
        return self._committer.staging.device_nbytes

    @property
    def reference_bytes(self) -> tuple[int, int]:
        """``(host, device)`` bytes of the references chains are built on (the copies of
        incremental, XOR and residual tensors the next commit compares with; see
        docs/policies.md): on the host, and on the tensors' devices."""
        return self._committer.reference_bytes()

    @property
    def keep(self) -> Retention | None:
        """The retention rule of the store at ``url`` (``open(url, keep=...)``): applied after
        each commit, or for a tiered store to the remote after each upload lands."""
        return self._committer.retention if self.tiers is None else self.tiers.remote_keep

    # -- commit ----------------------------------------------------------------------------
    def commit(self, state: object, message: str = "", branch: str = "main",
               tags: Sequence[str] = (), metadata: Metadata | None = None,
               policy: Policy | None = None, tracker: RowTracker | None = None) -> CommitInfo:
        """Store ``state`` as a new commit on ``branch`` and return its :class:`CommitInfo`.

        ``state`` is an ``nn.Module``, a state dict, or a mapping of names to objects with
        ``state_dict()``/``load_state_dict()`` and plain values. ``policy`` (default: the
        store's) chooses full, incremental or delta entries and quantization per tensor;
        ``tracker`` (:func:`ckptstore.track`) supplies the touched rows of embedding tables.

        The steps: flatten -> plan -> snapshot -> persist (data) -> manifest -> ref. Until the ref
        moves nothing is visible; if another writer moved the branch meanwhile,
        :class:`ConcurrentUpdateError` is raised and the commit stays stored (unreferenced) until
        gc.

        Under an initialised ``torch.distributed`` process group of more than one rank (and
        ``collective=True``, the default of :func:`open`) this is a collective: every rank calls
        it with its part of the state (DTensor shards, replicated tensors written once) and gets
        the same commit back (:mod:`ckptstore.dcp`).
        """
        if self.tiers is not None:
            self.tiers.before_commit(self._distributed())
        if self._distributed():
            from .dcp.collective import commit_collective
            info = commit_collective(self, state, message, branch, tags, metadata,
                                     policy or self.policy, tracker)
        else:
            info = self._committer.commit(state, message, branch, tags, metadata,
                                          policy or self.policy, tracker)
        if self.tiers is not None:
            self.tiers.queue(info.id, branch)
        return info

    def commit_async(self, state: object, message: str = "", branch: str = "main",
                     tags: Sequence[str] = (), metadata: Metadata | None = None,
                     policy: Policy | None = None, tracker: RowTracker | None = None,
                     staged: bool = False) -> PendingCommit:
        """Capture ``state`` now and persist it in the background (CheckFreq's two phases).

        Returns once every tensor is copied into reusable host staging buffers (pinned, with
        non-blocking copies on a side stream for CUDA tensors): the caller may then modify the
        model. At most one commit is in flight: this waits for the previous one first, and
        raises :class:`PendingCommitError` if it failed unobserved. ``staged=True`` takes the
        state as an already-made snapshot (e.g. a dict of pinned CPU tensors nobody modifies
        until ``wait()`` returns) and copies nothing.
        """
        if self.tiers is not None:
            self.tiers.before_commit(self._distributed())
        if self._distributed():
            from .dcp.collective import commit_async_collective
            pending = commit_async_collective(self, state, message, branch, tags, metadata,
                                              policy or self.policy, tracker)
        else:
            pending = self._committer.commit_async(state, message, branch, tags, metadata,
                                                   policy or self.policy, tracker, staged)
        if self.tiers is not None:
            self.tiers.queue_pending(pending, branch)
        return pending

    def reserve(self, state: object) -> Future[int]:
        """Allocate in the background the host staging buffers ``commit_async(state)`` copies
        into (pinned for CUDA tensors, every page faulted in), e.g. when training starts, so the
        first ``commit_async`` stalls no longer than the next ones instead of paying for the
        allocation. The next commit waits for it; the future resolves to the bytes allocated.
        Tensors that change shape or planning later simply get buffers of their own then."""
        return self._committer.reserve(state)

    def rebase(self, ref: str = "main", branch: str | None = None,
               message: str = "", progress: bool = False) -> CommitInfo:
        """Write the state of ``ref`` as a new full, lossless commit on ``branch`` (default: ``ref``
        when it is a branch, else ``main``), so that gc can collect the chains before it.
        ``progress`` shows a bar on stderr (read, then write)."""
        commit_id = self.resolve(ref)
        branch = branch or (ref if ref in self.refs.branches() else "main")
        m = self.manifest(commit_id)
        with bar(2, "rebase: read", progress, unit="step") as shown:
            state = self.checkout(commit_id)
            shown.update()
            shown.set_description("rebase: write")
            info = self.commit(state, message=message or f"rebase of {commit_id[:10]}",
                               branch=branch, metadata=dict(m.metadata), policy=Policy())
            shown.update()
        return info

    # -- restores ----------------------------------------------------------------------------
    def record_restore(self, commit_id: str) -> None:
        """Count one resume of training from a commit (drives :class:`~ckptstore.policy.BitWidth`)."""
        self.repo.record_restore(commit_id)

    def restore_count(self) -> int:
        """How many times training resumed from this store (``checkout(..., for_resume=True)``)."""
        return self.repo.restore_count()

    # -- checkout --------------------------------------------------------------------------
    def checkout(self, ref: str = "main", *, into: Any = None,
                 paths: str | Sequence[str] | None = None, map_location: Any = None,
                 for_resume: bool = False) -> Any:
        """Rebuild the state of a commit, or load it in place into live objects.

        Parameters
        ----------
        ref
            Branch, tag, commit id or unique prefix, with ``~N`` / ``^`` ancestry.
        into
            Live state to load in place, as ``dcp.load`` does: an object with
            ``load_state_dict``, a tensor, or a (nested) dict or list of them and of DTensors
            (``model.state_dict()``). Tensors are decoded straight into (by shard for
            DTensors), other values replaced in their dict; entries the commit has and
            ``into`` lacks are not added (they come back in the returned state).
        paths
            Glob patterns of dotted paths (``"model.emb.*"``): only those entries are read;
            ``"!optim"`` leaves entries out. A selection of nothing raises
            :class:`StateMismatchError`.
        map_location
            Device to move tensors to (``"cpu"``, ``"cuda:0"``, ``torch.device``); with
            ``into=`` the live tensors' own devices decide.
        for_resume
            Training resumes from this state: counted for the restore budget of quantized commits.

        See :mod:`ckptstore.checkout.flow` for the order of calls.
        """
        return checkout(self.repo, ref, into, paths, map_location, for_resume,
                        settle=self._settle, load_shards=self._load_shards)

    def _settle(self) -> None:
        """Before a load in place: the commit in flight lands (its references must not outlive
        the load) and the chain memory is forgotten (live tensors change behind any tracker)."""
        self._committer.wait()
        self._committer.forget_chains()

    def _load_shards(self, m: Manifest, shards: dict[str, Any]) -> None:
        """Load commit ``m`` into live DTensors by shard (:mod:`ckptstore.dcp.collective`)."""
        from .dcp.collective import load_shards
        load_shards(self, m, shards)

    def _distributed(self) -> bool:
        return self.collective and process_group()

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
        return CommitInfo.from_summary(self.repo.summary(self.resolve(ref)))

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
        self._committer.forget_chains(name)

    def branches(self) -> dict[str, str]:
        return self.refs.branches()

    # -- maintenance -----------------------------------------------------------------------
    def gc(self, keep_last: int | None = None, keep_tags: bool = True,
           keep_every: int | None = None, dry_run: bool = False,
           grace_period: float = 3600.0, progress: bool = False,
           tier: str = "local") -> GCResult:
        """Remove old commits and leftovers; see :func:`ckptstore.maintenance.gc.collect`.

        A tiered store collects one ``tier``: ``"local"`` (the default) never deletes a commit
        not uploaded yet, nor what it reads; ``"remote"`` never what a commit not uploaded yet
        or a local branch tip reads, and runs between two uploads (docs/tiers.md). A store of
        one tier takes ``tier="local"`` only (:class:`TierError` otherwise).
        """
        if tier not in ("local", "remote") or (tier == "remote" and self.tiers is None):
            raise TierError(f"gc(tier={tier!r}): " + (
                "this store has one tier: leave tier out, or open it with "
                "ckptstore.open(remote_url, local=PATH) to collect its remote"
                if tier == "remote" else "a tier is 'local' or 'remote'"))
        self._committer.wait()  # never collect the data of our own commit in flight
        options = dict(keep_last=keep_last, keep_tags=keep_tags, keep_every=keep_every,
                       dry_run=dry_run, grace_period=grace_period, progress=progress)
        if self.tiers is None:
            return collect(self.repo, **options)
        result = self.tiers.gc(tier, **options)
        for c in result.commits_removed if not dry_run else ():
            self.repo.forget(c)  # the tiered view's cache (it may still read the other tier)
        return result

    # -- tiers: open(url, local=...) ------------------------------------------------------
    @property
    def uploads(self) -> list[Upload]:
        """Where each commit of a tiered store stands (queued, uploading, uploaded, failed),
        in commit order; empty for a store of one tier."""
        return [] if self.tiers is None else self.tiers.uploads()

    def push(self, timeout: float | None = None) -> None:
        """Wait until every commit of a tiered store is on the remote (a failed upload is
        tried again); raises :class:`UploadError` or ``TimeoutError``. Nothing to do for a
        store of one tier."""
        if self.tiers is not None:
            self._committer.wait()
            self.tiers.push(timeout)

    def wait_uploaded(self, ref: str, timeout: float | None = None) -> CommitInfo:
        """Wait until the commit ``ref`` names (``store.commit(...).id``, a branch, a tag) is on
        the remote of a tiered store -- its upload and those queued before it -- and return its
        :class:`CommitInfo`; the same wait as ``PendingCommit.wait(uploaded=True)``. Raises the
        :class:`UploadError` that stops it (tried once more first), ``TimeoutError`` after
        ``timeout`` seconds, or :class:`TierError` on a store of one tier (there a commit is
        stored when it returns)."""
        if self.tiers is None:
            raise TierError("wait_uploaded needs a tiered store (ckptstore.open(url, "
                            "local=PATH)); this store has one tier: a commit is stored when "
                            "commit() returns")
        commit_id = self.resolve(ref)
        self.tiers.wait_uploaded(commit_id, timeout)
        return self.info(commit_id)

    def verify(self, ref: str | None = None, progress: bool = False) -> VerifyReport:
        """Check every chunk (existence and checksum) of ``ref``'s commit, or of every commit
        reachable from a branch or tag."""
        return verify(self.repo, ref, progress=progress)

    def reachable(self, roots: Iterable[str] | None = None) -> list[str]:
        """Commits reachable from branch tips and tags (or from ``roots``), newest first."""
        return self.repo.reachable(roots)

    # -- inspection: the library behind ckpt diff / du / export ----------------------------
    def diff(self, a: str, b: str, paths: Sequence[str] | None = None,
             progress: bool = False) -> DiffResult:
        """Tensors and plain values changed, added or removed from ``a`` to ``b``, with the
        largest absolute difference of each changed tensor; see :func:`ckptstore.maintenance.diff.diff`."""
        return diff(self.repo, a, b, paths, progress=progress)

    def usage(self, ref: str | None = None, limit: int | None = None,
              progress: bool = False) -> UsageReport:
        """Stored bytes per commit (own data, data of other commits it reads), newest first:
        every commit, or ``ref``'s history; see :func:`ckptstore.maintenance.usage.disk_usage`."""
        return disk_usage(self.repo, ref, limit, progress=progress)

    def iter_tensors(self, ref: str = "main", paths: Sequence[str] | None = None,
                     batch_bytes: int = BATCH_BYTES) -> Iterator[tuple[str, TensorLike]]:
        """``(dotted path, tensor)`` of a commit's tensors, read about ``batch_bytes`` at a time
        so the whole state is never in memory; see :func:`ckptstore.checkout.batches.iter_tensors`."""
        return iter_tensors(self.repo, ref, paths, batch_bytes)
