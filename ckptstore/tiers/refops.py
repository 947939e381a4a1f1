"""Branch and tag changes made on a tiered store's local tier, replayed on its remote in upload
order (issue 29): a branch made, moved (``reset_branch``) or deleted, a tag deleted.

Without them the remote would keep the old refs -- and after a local ``reset_branch`` the next
commit on that branch could not move the remote branch at all (its parent is not the remote
tip). Each change is a journal record (``op`` other than ``"commit"``) that the upload thread
applies after the records before it; applying one again (a kill before its record was
dropped) changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from typing import Protocol

from ..errors import ConcurrentUpdateError, RefNotFound, UploadError
from ..format.layout import manifest_key
from ..history.refs import Refs
from ..storage import Storage
from .copy import Sent, copy_commit
from .journal import Record

__all__ = ["MirroredRefs", "RefChangeQueue", "replay_ref_change"]


class RefChangeQueue(Protocol):
    """What queues a branch or tag change for the remote (:class:`~.tiered.Tiers`)."""

    def queue_ref_change(self, op: str, name: str, commit: str) -> None: ...


def replay_ref_change(local: Storage, remote: Storage, rec: Record, executor: Executor,
                      sent: Sent, stop: Callable[[], bool]) -> None:
    """Apply the branch or tag change of ``rec`` to the remote (a commit it names is made
    whole there first); raises :class:`UploadError` where the remote refuses it."""
    refs, name, commit = Refs(remote), rec.branch, rec.commit
    try:
        if rec.op == "delete-tag":
            if refs.tags().get(name) == commit:  # a tag renamed to another commit stays
                refs.delete_tag(name)
            return
        tip = refs.tip(name)
        if rec.op == "delete-branch":
            if tip is not None:
                refs.delete_branch(name)
            return
        if tip is not None and tip[1] == commit:
            return
        if not remote.exists(manifest_key(commit)):
            copy_commit(local, remote, commit, None, executor, sent, stop)
        if tip is None:
            refs.create_branch(name, commit)
        elif rec.op == "reset":
            refs.reset_branch(name, commit)
        else:
            raise UploadError(f"the remote already has a branch {name!r} (at {tip[1][:12]}); "
                              f"the local one made at {commit[:12]} is not copied over it: "
                              "rename one of them", commit_id=commit)
    except (ConcurrentUpdateError, RefNotFound) as e:
        raise UploadError(f"the {rec.op} of {name!r} could not be replayed on {remote.url}: "
                          f"{e}; store.push() tries again", commit_id=commit) from e


class MirroredRefs(Refs):
    """The refs of a tiered store: each branch made, moved or deleted and each tag deleted is
    also queued (``tiers.queue_ref_change``) to be replayed on the remote after what is queued
    before it. Tags made are uploaded with their commit, or by ``push``."""

    def __init__(self, storage: Storage, tiers: RefChangeQueue):
        super().__init__(storage)
        self.tiers = tiers

    def create_branch(self, branch: str, commit_id: str) -> None:
        super().create_branch(branch, commit_id)
        self.tiers.queue_ref_change("branch", branch, commit_id)

    def reset_branch(self, branch: str, commit_id: str) -> None:
        super().reset_branch(branch, commit_id)
        self.tiers.queue_ref_change("reset", branch, commit_id)

    def delete_branch(self, branch: str) -> None:
        tip = self.tip(branch)
        super().delete_branch(branch)
        if tip is not None:
            self.tiers.queue_ref_change("delete-branch", branch, tip[1])

    def delete_tag(self, name: str) -> None:
        target = self.tags().get(name)
        super().delete_tag(name)
        if target is not None:
            self.tiers.queue_ref_change("delete-tag", name, target)
