"""A tiered store's two tiers tied together: where commits queue, upload, and what gc may touch.

:class:`Tiers` is what ``ckptstore.open(url, local=path)`` hands the :class:`~ckptstore.Store`:
the storage it commits and reads through (:class:`~ckptstore.tiers.storage.TieredStorage`), the
upload journal and thread, the local byte budget (``upload_budget``) and the retention rules
of both tiers (``local_keep`` and the remote's ``remote_keep``, applied after each upload lands;
what they may never delete: :mod:`.retention`). Opening resumes the journal, and also queues any
commit a local branch has that the remote branch lacks (a process killed after its ref moved
but before its record was written loses nothing).

Under a process group each rank has a local tier of its own and journals its part of each
sharded commit (:meth:`Tiers.part_written`, called by the DCP writer once the part is
durable); the ranks other than the coordinator also keep the manifest and ref locally
(:meth:`Tiers.adopt`), so a restarted rank finds its shards on its own disk (:mod:`.parts`).
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..commit.pending import PendingCommit
from ..commit.process import WorkerSpec
from ..errors import ConcurrentUpdateError, NotAStoreError, TierError, UploadError
from ..format.layout import data_dir, manifest_key
from ..history.refs import Refs
from ..history.repository import Repository
from ..info import GCResult
from ..maintenance.gc import collect
from ..policy.retention import Retention, check_retention, retain_after_commit
from ..priority import block_interrupts
from ..storage import Storage
from .copy import copy_tags
from .journal import Journal, Record
from .landing import wait_landed
from .offload import UploadProcess
from .parts import RankInfo, claim_rank, part_key, read_rank
from .retention import Protect, reads
from .storage import TieredStorage
from .uploader import Upload, Uploader

__all__ = ["Tiers", "UploadBudgetWarning", "UploadWarning", "pending_uploads"]

#: seconds an open waits for a commit a persist process still lands (an earlier run's)
LANDING_TIMEOUT = 120.0


class UploadWarning(UserWarning):
    """A tiered store opened while its remote did not answer: uploads wait for it."""


class UploadBudgetWarning(UploadWarning):
    """A commit of a tiered store waited for uploads: the local tier held ``upload_budget``
    bytes of commits not yet on the remote."""


class Tiers:
    """The local tier, the remote, the journal and the uploader of one tiered store."""

    def __init__(self, local: Storage, remote: Storage, remote_options: dict[str, Any],
                 upload_budget: int | None = None, local_keep: Retention | None = None,
                 open_remote: Callable[[], object] | None = None,
                 remote_keep: Retention | None = None, upload_process: WorkerSpec | None = None):
        """``open_remote`` checks (or creates) the remote store; if the remote does not answer
        (an ``OSError`` other than :class:`NotAStoreError`), the store opens with a warning and
        its uploads wait for the remote. ``upload_process``: how an upload process opens both
        tiers to copy each commit (:mod:`.offload`); None: on the upload thread."""
        check_retention(local_keep)
        check_retention(remote_keep)
        if upload_budget is not None and upload_budget < 0:
            raise ValueError(f"upload_budget={upload_budget}: a number of bytes >= 0, or None")
        self.local, self.remote = local, remote
        self.rank: RankInfo | None = read_rank(local)  # a rank's local tier (.parts)
        self.storage = TieredStorage(local, remote, partial=self.rank is not None)
        self._parts: dict[str, Record] = {}  # parts journalled, their commit not returned yet
        self._parts_lock = threading.Lock()
        self.upload_budget, self.local_keep = upload_budget, local_keep
        self.remote_keep = remote_keep
        self.journal = Journal(local)
        # a local remote by its absolute path: `ckpt push` may run from another folder
        self.journal.set_remote(remote.root if remote.local_disk else remote.url, remote_options)
        # the local tier alone, as gc and local retention see it: a line of history ends where
        # its older commits were removed locally (after their upload)
        self.local_view = Repository(local, 2)
        self.remote_view = Repository(remote, 2)  # the remote alone (its gc and rule)
        self.view = Repository(self.storage, 2)  # both tiers: what a queued commit reads
        answers = self._reach(open_remote)
        if not wait_landed(local, LANDING_TIMEOUT):
            warnings.warn(f"a persist process still lands a commit on {local.url} after "
                          f"{LANDING_TIMEOUT:.0f} s (an earlier run's?): the next open queues "
                          "it", UploadWarning, stacklevel=3)
        self.uploader = Uploader(local, remote, self.journal, self._landed, None if
                                 upload_process is None else
                                 UploadProcess(upload_process, local, remote))
        self._queuer = ThreadPoolExecutor(1, thread_name_prefix="ckptstore-upload-queue",
                                          initializer=block_interrupts)
        self._resume(reconcile=answers)

    def _reach(self, open_remote: Callable[[], object] | None) -> bool:
        """Whether the remote answered ``open_remote`` (a warning if not)."""
        try:
            if open_remote is not None:
                open_remote()
            return True
        except NotAStoreError:
            raise
        except OSError as e:
            warnings.warn(f"the remote {self.remote.url} does not answer ({e}): commits land on "
                          "the local tier and upload once it does (store.push() tries again)",
                          UploadWarning, stacklevel=4)
            return False

    def _resume(self, reconcile: bool) -> None:
        """Queue the journal's records, then (``reconcile``) what local branches have beyond
        the remote's."""
        records = self.journal.records()
        for rec in records:
            if self._never_published(rec):
                self.journal.done(rec)
            else:
                self.uploader.add(rec)
        if not reconcile:
            return
        queued = {r.commit for r in records}
        remote_refs = Refs(self.remote)
        for branch, tip in Refs(self.local).branches().items():
            on_remote = set(remote_refs.history(branch))
            line: list[str] = []
            commit: str | None = tip
            while commit is not None and commit not in on_remote and commit not in queued:
                if not self.local.exists(manifest_key(commit)) or self._part_up(commit):
                    break  # removed locally (uploaded before, then local retention)
                line.append(commit)
                commit = self.local_view.summary(commit).parent
            for c in reversed(line):
                self.uploader.add(self._journal(c, branch))

    def _never_published(self, rec: Record) -> bool:
        """A coordinator's part of a commit whose manifest never reached its local tier: the
        sharded save failed before ``finish``, nobody was told of it."""
        return rec.op == "part" and rec.rank == 0 and not self.local.exists(
            manifest_key(rec.commit))

    def _part_up(self, commit: str) -> bool:
        """A rank other than the coordinator: its part of ``commit`` is on the remote."""
        return (self.rank is not None and self.rank.rank != 0
                and self.remote.exists(part_key(commit, self.rank.rank)))

    def _journal(self, commit: str, branch: str) -> Record:
        """A record for ``commit`` found on a local branch only: a rank's part on a rank's
        local tier, else a commit."""
        if self.rank is None:
            return self.journal.add(commit, branch, self._local_bytes(commit))
        return self.journal.add(commit, branch, self._local_bytes(commit), "part",
                                self.rank.rank, self.rank.world)

    def _local_bytes(self, commit: str) -> int:
        data = sum(self.local.walk_sizes(data_dir(commit)).values())
        try:
            return data + self.local.size(manifest_key(commit))
        except FileNotFoundError:  # a rank's part: the manifest is not written yet
            return data

    # -- what the store calls --------------------------------------------------------------
    def before_commit(self, distributed: bool = False) -> None:
        """Before a commit (``distributed``: a collective one, each rank's part uploaded by
        its own process, :mod:`.parts`): wait (with a warning) while the queued bytes fill the
        budget."""
        budget = self.upload_budget
        if budget is None or self.uploader.queued_bytes() < max(budget, 1):
            return
        warnings.warn(f"the local tier holds {self.uploader.queued_bytes()} bytes of commits "
                      f"not yet uploaded (upload_budget={budget}): this commit waits for "
                      f"uploads to {self.remote.url}", UploadBudgetWarning, stacklevel=3)
        self.uploader.wait(below=max(budget, 1))

    def queue(self, commit: str, branch: str) -> None:
        """A commit that landed on the local tier: journal it, then upload it in turn."""
        self._queuer.submit(self._add, commit, branch).result()

    def queue_pending(self, pending: PendingCommit, branch: str) -> None:
        """A ``commit_async`` commit: journalled and queued once it landed (a failed one is
        not)."""
        def add() -> None:
            pending.join()
            if not pending.failed:
                self._add(pending.wait().id, branch)
            else:
                self._settle_parts()

        pending.on_upload(self.wait_uploaded)
        self._queuer.submit(add)

    def wait_uploaded(self, commit: str, timeout: float | None = None) -> None:
        """Wait until ``commit`` is on the remote (``PendingCommit.wait(uploaded=True)``,
        ``Store.wait_uploaded``): the uploads queued before it and its own; raises
        :class:`UploadError` or ``TimeoutError`` (``timeout`` counts both waits)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._queuer.submit(lambda: None).result(timeout)  # a commit_async one queued first
        self.uploader.wait(timeout=None if deadline is None else
                           max(0.0, deadline - time.monotonic()), commit=commit)

    def _add(self, commit: str, branch: str) -> None:
        if commit in self._settle_parts():
            return  # a sharded commit: each rank's part was journalled as it landed
        self.uploader.add(self.journal.add(commit, branch, self._local_bytes(commit)))

    # -- a rank's part of a sharded commit (.parts) ----------------------------------------
    def part_written(self, commit: str, branch: str, rank: int, world: int) -> None:
        """Rank ``rank``'s part of ``commit`` is durable on this local tier (the DCP writer,
        before the coordinator moves any ref): journal it; it uploads once the commit
        returns (:meth:`queue`), or at the next open. Raises :class:`TierError` when another
        rank's local tier this is."""
        if self.rank != RankInfo(rank, world):
            self.rank = claim_rank(self.local, rank, world)
            self.storage.partial = True
        rec = self.journal.add(commit, branch, self._local_bytes(commit), "part", rank, world)
        with self._parts_lock:
            self._parts[commit] = rec

    def adopt(self, manifest: bytes, commit: str, branch: str) -> None:
        """On a rank other than the coordinator, once a sharded commit returned: its manifest
        (``manifest``, the coordinator's bytes) and the branch move on this local tier too,
        so that a restarted rank resolves and reads its shards locally."""
        self.local.put_if_absent(manifest_key(commit), manifest)
        refs = Refs(self.storage)  # both tiers' ref files: numbers go on above either's
        for _ in range(3):
            tip = refs.tip(branch)
            if tip is not None and tip[1] == commit:
                return
            try:
                if tip is None:
                    refs.create_branch(branch, commit)
                else:
                    refs.advance(branch, tip, commit)
                return
            except ConcurrentUpdateError:
                continue  # the uploads' ref files are not on this tier: read again

    def failed_commit(self) -> None:
        """A sharded commit failed: its parts journalled on this rank upload now (an orphan
        on the remote, collected by gc) or, on the coordinator without a manifest, go."""
        self._queuer.submit(self._settle_parts).result()

    def _settle_parts(self) -> set[str]:
        """Hand the parts journalled so far to the uploader (those of a commit that never
        reached the coordinator's local tier dropped); their commits."""
        with self._parts_lock:
            recs, self._parts = list(self._parts.values()), {}
        for rec in recs:
            if self._never_published(rec):
                self.journal.done(rec)
            else:
                self.uploader.add(rec)
        return {r.commit for r in recs}

    def queue_ref_change(self, op: str, name: str, commit: str) -> None:
        """A branch or tag change made on the local tier (``op``: "branch", "reset",
        "delete-branch", "delete-tag"): replayed on the remote after what is queued before
        it (:mod:`ckptstore.tiers.refops`)."""
        def add() -> None:
            self.uploader.add(self.journal.add(commit, name, 0, op=op))

        self._queuer.submit(add).result()

    def push(self, timeout: float | None = None) -> None:
        """Wait until every commit queued is on the remote (a failed one is tried again);
        raises :class:`UploadError` or ``TimeoutError``."""
        self._queuer.submit(lambda: None).result()  # the commit_async ones queued first
        self.uploader.wait(timeout=timeout)
        try:  # tags made after their commit was queued
            copy_tags(self.local, self.remote)
        except OSError as e:
            raise UploadError(f"tags could not be uploaded to {self.remote.url}: {e}; push "
                              "again") from e

    def uploads(self) -> list[Upload]:
        return self.uploader.status()

    def gc(self, tier: str = "local", **options: Any) -> GCResult:
        """:func:`~ckptstore.maintenance.gc.collect` on one tier (``"local"`` or ``"remote"``)
        with what it may never delete protected (:mod:`.retention`); the remote's between two
        uploads (it waits for the one under way)."""
        self._queuer.submit(lambda: None).result()  # the commit_async ones queued first
        if tier == "local":
            return collect(self.local_view, protect=self._local_protected(), **options)
        if self.rank is not None and self.rank.rank != 0:
            raise TierError(f"this local tier is rank {self.rank.rank}'s: collect the remote "
                            "from the coordinator's (rank 0), which knows every commit still "
                            "waiting for parts")
        with self.uploader.busy:
            return collect(self.remote_view, protect=self._remote_protected(), **options)

    def _local_protected(self) -> set[str]:
        """What the local tier keeps whatever its rules: the queued commits, the commits of a
        local branch the remote lacks (landed, perhaps not journalled yet: a ``commit_async``
        one is journalled once its handle completes), and what they read (an upload copies a
        base or a dedup'd folder the remote lacks from here)."""
        return reads(self.view, self.uploader.pending() | self._journalled_parts()
                     | self._not_uploaded())

    def _not_uploaded(self) -> set[str]:
        """The commits of each local branch from its tip back to one the remote holds (where
        the remote does not answer, the ones walked so far: local gc works offline)."""
        out: set[str] = set()
        for tip in Refs(self.local).branches().values():
            commit: str | None = tip
            while commit is not None and commit not in out:
                try:
                    if self.remote.exists(manifest_key(commit)):
                        break
                except OSError:
                    out.add(commit)
                    break
                out.add(commit)
                try:
                    commit = self.local_view.summary(commit).parent
                except FileNotFoundError:  # not on this tier (a rank's part)
                    break
        return out

    def _journalled_parts(self) -> set[str]:
        with self._parts_lock:
            return set(self._parts)

    def _remote_protected(self) -> set[str]:
        """What the remote keeps whatever its rules: what the queued commits and the local
        branch tips read."""
        return reads(self.view, self.uploader.pending() | self._journalled_parts()
                     | set(Refs(self.local).branches().values()))

    def _landed(self, commit: str) -> None:
        """After an upload, on the upload thread (under :attr:`Uploader.busy`): the rules (the
        remote's on the coordinator only, of a process group's tiers)."""
        if not self.local.exists(manifest_key(commit)):
            return  # a rank's part whose manifest this tier never got: nothing to rule on
        if self.local_keep is not None:
            retain_after_commit(self.local_view, Protect(self.local_keep,
                                                         self._local_protected()), commit)
        if self.remote_keep is not None and (self.rank is None or self.rank.rank == 0):
            retain_after_commit(self.remote_view, Protect(self.remote_keep,
                                                          self._remote_protected()), commit)

    def close(self) -> None:
        """Queue what landed, stop the uploads (the journal keeps the rest for the next open)."""
        try:
            self._queuer.shutdown(wait=True)
        finally:
            self.uploader.close()
            for repo in (self.local_view, self.remote_view, self.view):
                repo.close()


def pending_uploads(journal: Journal, remote: Storage | None) -> list[Upload]:
    """The journal's commits not on the remote yet, with their last failure; ``sent``: the
    bytes of their own data the remote holds already (None ``remote``: not asked)."""
    out = []
    for rec in journal.records():
        error = journal.failure(rec)
        sent = 0 if remote is None else sum(remote.walk_sizes(data_dir(rec.commit)).values())
        state = "failed" if error else "uploading" if sent else "local-only"
        out.append(Upload(rec.commit, rec.branch, state, rec.bytes, min(sent, rec.bytes), error,
                          rec.op, rec.rank, rec.world))
    return out
