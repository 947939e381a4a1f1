"""The last step of every commit: manifest, then ref, then tags, then retention.

One publish serves the three ways a commit lands -- ``Store.commit``/``commit_async``
(:class:`~ckptstore.commit.committer.Committer`), the coordinator's merge of a sharded commit
(:func:`ckptstore.dcp.shards.merge`, driven by ``commit_shards`` and DCP's
``StorageWriter.finish``) -- with one set of errors: a back-end fault says what became of the
branch (:func:`reporting`), a tag another writer took meanwhile says not to commit again.
The commit becomes visible only when the ref moves; a crash before leaves the branch as it was.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from ..errors import RefExists, StorageError, StorageFullError
from ..format.layout import check_ref_name, tag_key
from ..history.manifest import Manifest
from ..policy.retention import Retention, retain_after_commit
from ..history.refs import Tip
from ..history.repository import Repository

__all__ = ["Target", "check_tags_free", "publish", "reporting", "tag_names"]


@dataclass(frozen=True)
class Target:
    """Where a commit lands: ``branch``, moved from ``tip`` (None: a new branch), and ``tags``."""

    branch: str
    tip: Tip | None
    tags: tuple[str, ...] = ()


def tag_names(tags: str | Sequence[str]) -> tuple[str, ...]:
    """The checked tag names of a commit (one name or several)."""
    return tuple(check_ref_name(t, "tag") for t in ([tags] if isinstance(tags, str) else tags))


def check_tags_free(repo: Repository, tags: Sequence[str]) -> None:
    """Raise :class:`RefExists` before anything is written if a tag is taken."""
    for t in tags:
        if repo.storage.exists(tag_key(t)):
            raise RefExists(f"tag {t!r} already exists; choose another name")


class _Moving:
    """Whether the ref move was attempted (a lost answer then leaves the branch unknown)."""

    started = False


@contextmanager
def reporting(repo: Repository, target: Target, commit_id: str) -> Iterator[_Moving]:
    """Turn a back-end fault (an ``OSError`` after its retries) in a commit's writes into the
    :class:`StorageError` that says what became of the branch and what to do; a fault whose
    ref move did land is no failure (the block ends there)."""
    moving = _Moving()
    try:
        yield moving
    except OSError as e:
        landed = _ref_landed(repo, target.branch, commit_id) if moving.started else False
        if landed is not True:
            raise _write_failed(e, target, commit_id, unknown=landed is None) from e


def publish(repo: Repository, target: Target, manifest: Manifest,
            landed: Callable[[], None] | None = None,
            retention: Retention | None = None) -> Manifest:
    """Write ``manifest``, move ``target.branch`` to it, call ``landed`` (the commit is
    visible), create the tags, apply ``retention``; return the manifest."""
    with reporting(repo, target, manifest.id) as moving:
        repo.write_manifest(manifest)
        moving.started = True
        repo.refs.advance(target.branch, target.tip, manifest.id)
    if landed is not None:
        landed()
    for t in target.tags:
        try:
            repo.refs.create_tag(t, manifest.id)
        except RefExists:
            raise RefExists(f"commit {manifest.id} was made on {target.branch!r}, but another "
                            f"writer created tag {t!r} meanwhile; do not commit again -- tag "
                            "this commit with another name") from None
    if retention is not None:
        retain_after_commit(repo, retention, manifest.id)
    return manifest


def _ref_landed(repo: Repository, branch: str, commit_id: str) -> bool | None:
    """After a failed ref move: whether the branch points at the commit (None: unknown)."""
    try:
        tip = repo.refs.tip(branch)
    except OSError:
        return None
    return tip is not None and tip[1] == commit_id


def _write_failed(error: OSError, target: Target, commit_id: str,
                  unknown: bool) -> StorageError:
    """The error of a commit whose writes failed: what became of the branch, what to do."""
    tip = target.tip[1][:12] if target.tip else "no commit"
    state = (f"the answer to moving branch {target.branch!r} was lost: look with store.log() "
             "whether it points at this commit before committing again" if unknown else
             f"nothing was made visible, branch {target.branch!r} is unchanged (at {tip})")
    full = isinstance(error, StorageFullError) or getattr(error, "errno", None) in (
        errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
    kind, todo = (StorageFullError, "free space, then commit again") if full else (
        StorageError, "commit again once the storage answers")
    return kind(f"commit {commit_id[:12]} failed: {error}. So {state}; {todo}. store.gc() "
                "removes the partial data once older than its grace period.",
                key=getattr(error, "key", None) or getattr(error, "filename", None),
                errno=getattr(error, "errno", None))
