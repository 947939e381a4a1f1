"""A tiered store's two tiers tied together: where commits queue, upload, and what gc may touch.

:class:`Tiers` is what ``ckptstore.open(url, local=path)`` hands the :class:`~ckptstore.Store`:
the storage it commits and reads through (:class:`~ckptstore.tiers.storage.TieredStorage`), the
upload journal and thread, the local byte budget (``upload_budget``) and the retention rules
of both tiers (``local_keep`` and the remote's ``remote_keep``, applied after each upload lands;
what they may never delete: :mod:`.retention`). Opening resumes the journal, and also queues any
commit a local branch has that the remote branch lacks (a process killed after its ref moved
but before its record was written loses nothing).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..commit.pending import PendingCommit
from ..errors import DistributedError, NotAStoreError, UploadError
from ..format.layout import data_dir, manifest_key
from ..history.refs import Refs
from ..history.repository import Repository
from ..info import GCResult
from ..maintenance.gc import collect
from ..policy.retention import Retention, check_retention, retain_after_commit
from ..storage import Storage
from .copy import copy_tags
from .journal import Journal
from .retention import Protect, reads
from .storage import TieredStorage
from .uploader import Upload, Uploader

__all__ = ["Tiers", "UploadBudgetWarning", "UploadWarning", "pending_uploads"]


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
                 remote_keep: Retention | None = None):
        """``open_remote`` checks (or creates) the remote store; if the remote does not answer
        (an ``OSError`` other than :class:`NotAStoreError`), the store opens with a warning and
        its uploads wait for the remote."""
        check_retention(local_keep)
        check_retention(remote_keep)
        if upload_budget is not None and upload_budget < 0:
            raise ValueError(f"upload_budget={upload_budget}: a number of bytes >= 0, or None")
        self.local, self.remote = local, remote
        self.storage = TieredStorage(local, remote)
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
        self.uploader = Uploader(local, remote, self.journal, self._landed)
        self._queuer = ThreadPoolExecutor(1, thread_name_prefix="ckptstore-upload-queue")
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
                if not self.local.exists(manifest_key(commit)):
                    break  # removed locally (uploaded before, then local retention)
                line.append(commit)
                commit = self.local_view.manifest(commit).parent
            for c in reversed(line):
                self.uploader.add(self.journal.add(c, branch, self._local_bytes(c)))

    def _local_bytes(self, commit: str) -> int:
        return sum(self.local.walk_sizes(data_dir(commit)).values()) + self.local.size(
            manifest_key(commit))

    # -- what the store calls --------------------------------------------------------------
    def before_commit(self, distributed: bool) -> None:
        """Before a commit: refuse one under a process group (not yet supported), and wait
        (with a warning) while the queued bytes fill the budget."""
        if distributed:
            raise DistributedError(
                "a tiered store (open(url, local=...)) commits from one process only, for now: "
                "per-rank uploads are not there yet. Open it with collective=False on the rank "
                "that commits, or open the remote without local=")
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
        self.uploader.add(self.journal.add(commit, branch, self._local_bytes(commit)))

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
        with self.uploader.busy:
            return collect(self.remote_view, protect=self._remote_protected(), **options)

    def _local_protected(self) -> set[str]:
        """What the local tier keeps whatever its rules: the queued commits and what they read
        (an upload copies a base or a dedup'd folder the remote lacks from here)."""
        return reads(self.view, self.uploader.pending())

    def _remote_protected(self) -> set[str]:
        """What the remote keeps whatever its rules: what the queued commits and the local
        branch tips read."""
        return reads(self.view, self.uploader.pending() | set(Refs(self.local).branches()
                                                              .values()))

    def _landed(self, commit: str) -> None:
        """After an upload, on the upload thread (under :attr:`Uploader.busy`): the rules."""
        if self.local_keep is not None:
            retain_after_commit(self.local_view, Protect(self.local_keep,
                                                         self._local_protected()), commit)
        if self.remote_keep is not None:
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
                          rec.op))
    return out
