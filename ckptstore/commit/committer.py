"""The store's committer: the one pipeline plus at most one commit in flight.

A :class:`Committer` is the :class:`~ckptstore.commit.pipeline.Pipeline` (chain memory, staging
buffers, the steps prepare -> capture -> write -> publish) with what running a commit in the
background needs: the one persist thread at the background priority, the at-most-one commit in
flight (:attr:`Committer.inflight`) and, under a process group, the gloo group of collective
``commit_async`` (:attr:`Committer.async_group`). ``commit`` runs every step in the caller's
thread; ``commit_async`` returns after the capture and writes and publishes on the persist
thread; the distributed paths (:mod:`ckptstore.dcp.collective`, :mod:`ckptstore.dcp`,
:mod:`ckptstore.dcp.shards`) drive a rank's fork and the coordinator's merge of the same pipeline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from typing import TypeVar

from ..errors import StagingBudgetError
from ..format.ids import new_commit_id
from ..info import CommitInfo
from .pending import PendingCommit, Progress
from .pipeline import CommitJob, Metadata, Pipeline
from .placement import place, tracked_rows
from .plan import ArrayItem, CommitPlan, EncodingOptions, plan_commit
from ..policy import Policy
from ..priority import DEFAULT_PRIORITY, BackgroundThreads
from .publish import publish, reporting
from .records import build_manifest
from .shared import local_shard
from ..history.repository import Repository
from .snapshot import Snapshot
from ..state.tree import flatten
from ..tracking.rows import RowTracker

__all__ = ["Committer"]

T = TypeVar("T")


class Committer(Pipeline):
    """The pipeline, the persist thread, at most one commit in flight.

    Attributes
    ----------
    inflight
        The :class:`PendingCommit` of the last ``commit_async`` (a collective one too: the
        distributed path sets it), which the next commit, ``gc`` and ``close`` wait for.
    async_group
        The gloo process group of the store's own that collective ``commit_async`` commits over
        (made by :mod:`ckptstore.dcp.collective` on first use), so its collectives never interleave
        with training's; None until then.
    """

    def __init__(self, repo: Repository, options: EncodingOptions,
                 staging_budget: int | None = None,
                 background_priority: str = DEFAULT_PRIORITY):
        super().__init__(repo, options, staging_budget)
        # raised to normal priority while a caller waits for them (priority inheritance)
        self.background = BackgroundThreads(background_priority)
        self.background_priority = background_priority
        self._persister = self.background.pool(1, "ckptstore-persist")
        # the I/O threads of commit_async's persist (made on first use): at the background
        # priority, apart from the store's pool that callers wait on
        self._background_io: ThreadPoolExecutor | None = None
        self.inflight: PendingCommit | None = None
        self.async_group: object = None
        self._reserving: Future[int] | None = None
        # the job and snapshot of the last commit_async, released on a caller's thread
        self._retired: tuple[CommitJob, Snapshot] | None = None

    def close(self) -> None:
        """Wait for the commit in flight (raising its unobserved failure), then stop."""
        try:
            self.wait()
        finally:
            self._persister.shutdown(wait=True)
            if self._background_io is not None:
                self._background_io.shutdown(wait=True)
            self._retired = None
            self.background.close()
            self.staging.clear()

    @property
    def staging_nbytes(self) -> int:
        """Host bytes of the staging buffers ``commit_async`` copies into."""
        return self.staging.nbytes

    def reference_bytes(self) -> tuple[int, int]:
        """``(host, device)`` bytes of the references chains are built on."""
        return self.chains.nbytes()

    def forget_chains(self, branch: str | None = None) -> None:
        """Drop chain references (of ``branch``, or all): the next commits are baselines."""
        self.chains.forget(branch)

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
        pending = self.inflight
        if pending is not None:
            if not pending.done():
                with self.background.boosted():
                    pending.join()
            self._retired = None
            pending.raise_unobserved()

    def reserve(self, state: object) -> Future[int]:
        """Allocate, on the persist thread, the staging buffers ``commit_async(state)`` will
        copy into (pinned for CUDA tensors, every page faulted in; on the GPU too where it has
        room), so that the first commit stalls no longer than the next ones. The next commit
        waits for it; resolves to the bytes allocated."""
        self.wait()
        _, leaves = flatten(state)
        if any(local_shard(leaf.value) is not leaf.value for leaf in leaves):
            done: Future[int] = Future()  # DTensors: a collective commit_async, which DCP's
            done.set_result(0)            # stager copies on this thread (nothing to reserve)
            return done
        plan = plan_commit(leaves, self.options)

        placements = place(plan, self.options.device_encode, pooled=True, host_values=True)

        def run() -> int:
            done = self.staging.reserve_packed(plan.packed_nbytes) if plan.packed_nbytes else 0
            for p in plan.stored():
                if isinstance(p, ArrayItem):
                    done += self.staging.reserve(p.array, p.source)
                    if placements[p.index].capture.on_device:  # the device snapshot's buffer
                        done += self.staging.reserve_device(p.array, p.source)
            return done

        self._reserving = self._persister.submit(run)
        return self._reserving

    # -- the two entry points --------------------------------------------------------------
    def commit(self, state: object, message: str, branch: str, tags: Sequence[str],
               metadata: Metadata | None, policy: Policy, tracker: RowTracker | None
               ) -> CommitInfo:
        """Every step in the caller's thread."""
        self.wait()
        job = self.prepare(state, message, branch, tags, metadata, policy, tracker)
        return self.finish(job, self.capture(job))

    def commit_async(self, state: object, message: str, branch: str, tags: Sequence[str],
                     metadata: Metadata | None, policy: Policy, tracker: RowTracker | None,
                     staged: bool) -> PendingCommit:
        """Prepare and capture now, write and publish on the persist thread (CheckFreq's two
        phases)."""
        t0 = time.perf_counter()  # the stall includes waiting for the previous persist
        self.wait()
        job = self.prepare(state, message, branch, tags, metadata, policy, tracker)
        if not staged:
            _check_staging_budget(job.plan, self.staging.budget)
        snap = self.capture(job, None if staged else self.staging)
        pending = PendingCommit(time.perf_counter() - t0, snap.nbytes, self.background.boosted)

        executor = self._persist_executor()

        # The persist thread never drops the last reference to the job: freeing the tensor
        # objects of its plan (one per leaf) hands the GIL over once each (torch releases it in
        # a tensor's dealloc), a wait of up to the switch interval each beside a busy training
        # thread. _retired holds them until the next wait (a commit, close), on a caller's thread.
        self._retired = (job, snap)

        def run() -> None:
            nonlocal job, snap
            self.background.begin()  # raised from the start after a starved persist
            try:
                info, error = self.finish(job, snap, pending.progress, executor), None
            except BaseException as e:  # noqa: BLE001 - handed to the caller through wait()
                info, error = None, e
            job = snap = None  # type: ignore[assignment]
            self.background.settle()  # a persist raised because it starved: low again
            pending.finish(info, error)

        self.inflight = pending
        self._persister.submit(run)
        return pending

    def raised(self) -> AbstractContextManager[None]:
        """While the caller waits for a persist: it runs at normal priority (priority
        inheritance; the collective paths wrap their waits in it)."""
        return self.background.boosted()

    def parts_in_process(self, state: object, policy: Policy, tracker: RowTracker | None,
                         asynchronous: bool) -> bool:
        """Whether this rank's part of a sharded commit of ``state`` goes to a persist process
        (``ProcessCommitter.part``); asked on the caller's thread before the collective starts.
        Here, a thread's committer: never."""
        return False

    def in_background(self, fn: Callable[[Executor], T]) -> Future[T]:
        """``fn(io_pool)`` on the persist thread at the background priority, as a persist runs
        (raised from the start after a starved one; the background I/O pool); not a commit in
        flight (a persist process's part of a sharded commit)."""
        executor = self._persist_executor()

        def run() -> T:
            self.background.begin()
            try:
                return fn(executor)
            finally:
                self.background.settle()
        return self._persister.submit(run)

    def finish(self, job: CommitJob, snap: Snapshot, progress: Progress | None = None,
               executor: Executor | None = None) -> CommitInfo:
        """Write, then publish (the chain memory is updated once the ref moved); ``executor``:
        the I/O pool (default: the store's)."""
        commit_id = new_commit_id()
        with reporting(self.repo, job.target, commit_id):
            written = self.write(job, snap, commit_id, executor, progress)
        manifest = build_manifest(commit_id, job.parent, job.message, job.metadata, job.tree,
                                  job.plan, written.done)
        publish(self.repo, job.target, manifest, lambda: self.remember(written), self.retention)
        return CommitInfo.from_manifest(manifest)


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

