"""The act of committing: flatten -> plan -> snapshot -> persist -> manifest -> ref.

A :class:`Committer` owns what writing needs beyond the repository: the chain memory (the
references of the next incremental or delta entries), the reusable staging buffers, the one
persist thread and the at-most-one commit in flight. The call order of one commit::

    1. flatten(state)                         -> tree, leaves              (state.py)
    2. plan_commit(leaves, options, decide)   -> CommitPlan                 (plan.py, chains/)
    3. snapshot(plan, staging)                -> Snapshot by item index     (writer.py)
       -- commit_async returns here; training may modify the state --
    4. shrink_snapshot(plan, snapshot)        -> pruned residuals, moments  (shrinking.py)
       persist(storage, id, plan, snapshot)   -> Persisted by item index    (writer.py)
    5. build_manifest(...); write_manifest    -> commits/<id>.msgpack       (records.py)
    6. refs.advance(branch, tip, id)          -> the commit becomes visible (refs.py)
    7. chains.commit_done(...); tags           (after the ref moved)
    8. apply_retention(repo, retention)        (open(keep=...): after the commit landed)
"""

from __future__ import annotations

import errno
import time
from collections.abc import Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass

from .chains.memory import ChainMemory
from .dedup import Dedup
from .devquant import device_items, staged_items
from .errors import RefExists, StagingBudgetError, StorageError, StorageFullError
from .ids import new_commit_id
from .info import CommitInfo
from .layout import check_ref_name, tag_key
from .manifest import Manifest
from .pending import PendingCommit, Progress
from .plan import ArrayItem, CommitPlan, EncodingOptions, plan_commit
from .policy import Policy
from .records import build_manifest
from .policy.retention import Retention, retain_after_commit
from .policy.shrink import Shrink
from .priority import DEFAULT_PRIORITY, BackgroundThreads
from .refs import Tip
from .repository import Repository
from .sensitivity import Gradients, capture_gradients, score_snapshot
from .shrinking import shrink_snapshot
from .staging import StagingPool
from .state import Tree, check_text, flatten
from .tracking import RowTracker
from .snapshot import Snapshot, snapshot, tracked_rows
from .writer import persist

__all__ = ["CommitJob", "Committer", "Metadata"]

Metadata = dict[str, object]  # plain values only: None, bool, int, float, str
_PLAIN = (type(None), bool, int, float, str)


@dataclass(frozen=True, eq=False)
class CommitJob:
    """A planned commit between its snapshot and its persist."""

    branch: str
    tags: tuple[str, ...]
    message: str
    metadata: Metadata
    tree: Tree
    plan: CommitPlan
    tip: Tip | None
    parent: Manifest | None
    tracker: RowTracker | None
    shrink: Shrink | None = None
    gradients: Gradients | None = None  # Policy(sensitivity=...): gradient averages by item


class Committer:
    """At most one commit in flight, the staging pool, the persist thread, the chain memory."""

    retention: Retention | None = None  # open(keep=...): applied by finish once a commit landed

    def __init__(self, repo: Repository, options: EncodingOptions,
                 staging_budget: int | None = None,
                 background_priority: str = DEFAULT_PRIORITY):
        self.repo = repo
        self.options = options
        self.chains = ChainMemory()
        self.staging = StagingPool(staging_budget)
        # encoded chunks in memory at once: enough to keep the workers busy, at most ~64 MiB
        self.max_inflight = max(2, min(2 * repo.io_workers, (64 << 20) // options.chunk_bytes))
        # raised to normal priority while a caller waits for them (priority inheritance)
        self.background = BackgroundThreads(background_priority)
        self.background_priority = background_priority
        self._persister = self.background.pool(1, "ckptstore-persist")
        # the I/O threads of commit_async's persist (made on first use): at the background
        # priority, apart from the store's pool that callers wait on
        self._background_io: ThreadPoolExecutor | None = None
        self._inflight: PendingCommit | None = None
        self._reserving: Future[int] | None = None

    def close(self) -> None:
        """Wait for the commit in flight (raising its unobserved failure), then stop."""
        try:
            self.wait()
        finally:
            self._persister.shutdown(wait=True)
            if self._background_io is not None:
                self._background_io.shutdown(wait=True)
            self.background.close()
            self.staging.clear()

    def _persist_executor(self) -> Executor:
        """The I/O pool of a background persist (the store's own at ``"normal"`` priority, or
        while a wait could not raise the background threads)."""
        if self.background_priority == "normal":
            return self.repo.executor
        if self._background_io is None:
            self._background_io = self.background.pool(self.repo.io_workers, "ckptstore-bg-io")
        return self.background.executor(self._background_io, self.repo.executor)

    def wait(self) -> None:
        """Wait for the commit in flight (and a reservation of staging buffers); raise
        :class:`PendingCommitError` if it failed unobserved. The background threads run at
        normal priority meanwhile, so busy cores cannot starve what the caller waits for."""
        reserving, self._reserving = self._reserving, None
        if reserving is not None:
            with nullcontext() if reserving.done() else self.background.boosted():
                reserving.result()
        pending = self._inflight
        if pending is not None:
            if not pending.done():
                with self.background.boosted():
                    pending._done.wait()
            pending.raise_unobserved()

    def reserve(self, state: object) -> Future[int]:
        """Allocate, on the persist thread, the staging buffers ``commit_async(state)`` will
        copy into (pinned for CUDA tensors, every page faulted in; on the GPU too where it has
        room), so that the first commit stalls no longer than the next ones. The next commit
        waits for it; resolves to the bytes allocated."""
        self.wait()
        _, leaves = flatten(state)
        plan = plan_commit(leaves, self.options)

        on_device = staged_items(plan, self.options.device_encode)

        def run() -> int:
            done = self.staging.reserve_packed(plan.packed_nbytes) if plan.packed_nbytes else 0
            for p in plan.stored():
                if isinstance(p, ArrayItem):
                    done += self.staging.reserve(p.array, p.source)
                    if p.index in on_device:  # the device-to-device snapshot's buffer
                        done += self.staging.reserve_device(p.array, p.source)
            return done

        self._reserving = self._persister.submit(run)
        return self._reserving

    # -- the two entry points --------------------------------------------------------------
    def commit(self, state: object, message: str, branch: str, tags: Sequence[str],
               metadata: Metadata | None, policy: Policy, tracker: RowTracker | None
               ) -> CommitInfo:
        """Steps 1-7 in the caller's thread."""
        self.wait()
        job = self.prepare(state, message, branch, tags, metadata, policy, tracker)
        snap = snapshot(job.plan, encode=self._on_device(job),
                        stage=staged_items(job.plan, self.options.device_encode))
        if tracker is not None:
            tracker.clear()  # rows seen so far are in the plan (kept as unsaved until the ref moves)
        return self.finish(job, snap)

    def commit_async(self, state: object, message: str, branch: str, tags: Sequence[str],
                     metadata: Metadata | None, policy: Policy, tracker: RowTracker | None,
                     staged: bool) -> PendingCommit:
        """Steps 1-3 now, 4-7 on the persist thread (CheckFreq's two phases)."""
        t0 = time.perf_counter()  # the stall includes waiting for the previous persist
        self.wait()
        job = self.prepare(state, message, branch, tags, metadata, policy, tracker)
        if not staged:
            _check_staging_budget(job.plan, self.staging.budget)
        snap = snapshot(job.plan, None if staged else self.staging, self._on_device(job),
                        staged_items(job.plan, self.options.device_encode))
        if tracker is not None:
            tracker.clear()
        pending = PendingCommit(time.perf_counter() - t0, snap.nbytes, self.background.boosted)

        executor = self._persist_executor()

        def run() -> None:
            try:
                info = self.finish(job, snap, pending.progress, executor)
            except BaseException as e:  # noqa: BLE001 - handed to the caller through wait()
                pending._finish(None, e)
            else:
                pending._finish(info, None)

        self._inflight = pending
        self._persister.submit(run)
        return pending

    def _on_device(self, job: CommitJob) -> frozenset[int]:
        """Items quantized on their device (none where the values on the host are needed:
        Shrink and sensitivity rework the snapshot's arrays)."""
        if job.shrink is not None or job.gradients is not None:
            return frozenset()
        return device_items(job.plan, self.options.device_encode, self.options.dedup)

    def resolve_bits(self, policy: Policy) -> Policy:
        """The policy with a restore-driven bit width fixed from the store's restore records."""
        if policy.bitwidth is None:
            return policy
        return policy.with_bits(policy.bitwidth.bits(self.repo.restore_count()))

    # -- the steps -------------------------------------------------------------------------
    def prepare(self, state: object, message: str, branch: str, tags: Sequence[str],
                metadata: Metadata | None, policy: Policy,
                tracker: RowTracker | None) -> CommitJob:
        """Steps 1-2: check names, flatten, plan (the policy and the chain memory decide).

        A policy with a restore-driven bit width is resolved here, after the wait for the
        previous commit (it lists the store's restore records: part of the stall)."""
        policy = self.resolve_bits(policy)
        check_ref_name(branch, "branch")
        tags = tuple(check_ref_name(t, "tag") for t in ([tags] if isinstance(tags, str) else tags))
        for t in tags:
            if self.repo.storage.exists(tag_key(t)):
                raise RefExists(f"tag {t!r} already exists; choose another name")
        metadata = _plain_metadata(metadata or {}, state)
        check_text(message, "message")
        tree, leaves = flatten(state)                                        # 1. flatten
        tip = self.repo.refs.tip(branch)
        parent = self.repo.manifest(tip[1]) if tip else None
        decide = self.chains.decider(policy, branch, parent, tracker)
        plan = plan_commit(leaves, self.options, decide)                     # 2. plan
        gradients = (capture_gradients(plan, policy.sensitivity)
                     if policy.sensitivity is not None else None)
        return CommitJob(branch, tags, message, metadata, tree, plan, tip, parent, tracker,
                         policy.shrink, gradients)

    def _ref_landed(self, branch: str, commit_id: str) -> bool | None:
        """After a failed ref move: whether the branch points at the commit (None: unknown)."""
        try:
            tip = self.repo.refs.tip(branch)
        except OSError:
            return None
        return tip is not None and tip[1] == commit_id

    def finish(self, job: CommitJob, snap: Snapshot, progress: Progress | None = None,
               executor: Executor | None = None) -> CommitInfo:
        """Steps 4-7: persist, manifest, ref, then remember the chains and tag; ``executor``:
        the I/O pool (default: the store's)."""
        commit_id = new_commit_id()
        dedup = Dedup.against(job.parent) if self.options.dedup else None
        snap.settle(self.staging)  # device-staged tensors not quantized there: to the host
        if job.shrink is not None:
            shrink_snapshot(job.plan, snap, job.shrink)
        if job.gradients is not None and job.gradients.averages:
            score_snapshot(snap, job.gradients)
        moving = False
        try:
            done = persist(self.repo.storage, commit_id, job.plan, snap,      # 4. persist
                           executor or self.repo.executor, self.max_inflight,
                           self.options.chunk_bytes,
                           progress, dedup=dedup)
            manifest = build_manifest(commit_id, job.parent, job.message, job.metadata,
                                      job.tree, job.plan, done)
            self.repo.write_manifest(manifest)                                # 5. manifest
            moving = True
            self.repo.refs.advance(job.branch, job.tip, commit_id)            # 6. ref
        except OSError as e:  # a back-end fault (after its retries): say what is left
            landed = self._ref_landed(job.branch, commit_id) if moving else False
            if landed is not True:
                raise _write_failed(e, job, commit_id, unknown=landed is None) from e
        self.chains.commit_done(job.branch, commit_id, job.plan, snap.arrays,  # 7.
                                {i: r.codes for i, r in done.results.items()}, job.tracker,
                                {i: r.rebuilt for i, r in done.results.items()},
                                snap.next_references, snap.gathered)
        for t in job.tags:
            try:
                self.repo.refs.create_tag(t, commit_id)
            except RefExists:
                raise RefExists(f"commit {commit_id} was made on {job.branch!r}, but another "
                                f"writer created tag {t!r} meanwhile; do not commit again -- tag "
                                f"this commit with another name") from None
        if self.retention is not None:                                   # 8. retention
            retain_after_commit(self.repo, self.retention, commit_id)
        return CommitInfo.from_manifest(manifest)


def _write_failed(error: OSError, job: CommitJob, commit_id: str, unknown: bool) -> StorageError:
    """The error of a commit whose writes failed: what became of the branch, what to do."""
    tip = job.tip[1][:12] if job.tip else "no commit"
    state = (f"the answer to moving branch {job.branch!r} was lost: look with store.log() "
             "whether it points at this commit before committing again" if unknown else
             f"nothing was made visible, branch {job.branch!r} is unchanged (at {tip})")
    full = isinstance(error, StorageFullError) or getattr(error, "errno", None) in (
        errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
    kind, todo = (StorageFullError, "free space, then commit again") if full else (
        StorageError, "commit again once the storage answers")
    return kind(f"commit {commit_id[:12]} failed: {error}. So {state}; {todo}. store.gc() "
                "removes the partial data once older than its grace period.",
                key=getattr(error, "key", None) or getattr(error, "filename", None),
                errno=getattr(error, "errno", None))


def _check_staging_budget(plan: CommitPlan, budget: int | None) -> None:
    """Refuse, before anything is copied, a snapshot whose buffers would exceed ``budget``."""
    if budget is None:
        return
    need = plan.packed_nbytes
    for p in plan.stored():
        if isinstance(p, ArrayItem):
            rows = tracked_rows(p)  # a tracked increment stages its rows only
            need += p.nbytes if rows is None else p.nbytes // max(p.shape[0], 1) * rows.size
    if need > budget:
        raise StagingBudgetError(
            f"commit_async needs {need} bytes of host staging buffers, more than "
            f"staging_budget={budget}: raise the budget, commit the state in parts, or use "
            "commit() (it copies nothing); nothing was copied or written")


def _plain_metadata(metadata: Metadata, state: object) -> Metadata:
    out = dict(metadata)
    if isinstance(state, dict):
        for key in ("step", "epoch"):
            if key in state and key not in out and isinstance(state[key], (int, float)):
                out[key] = state[key]
    for k, v in out.items():
        if not isinstance(k, str) or not isinstance(v, _PLAIN):
            raise TypeError(f"metadata[{k!r}] must be a str key with a plain value "
                            "(None, bool, int, float, str)")
        check_text(k, "metadata")
        check_text(v, f"metadata[{k!r}]")
    return out
