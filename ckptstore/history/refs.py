"""Branches and tags.

A branch is a folder of immutable, numbered ref files (``refs/heads/<branch>/<seq>``), each holding
a commit id; the highest number is the tip. Moving a branch means creating file ``seq + 1`` with
put-if-absent, so of two writers that both saw tip ``seq`` exactly one wins -- compare-and-swap
without a lock, on every fsspec backend. A tag is one immutable file ``refs/tags/<name>``.
"""

from __future__ import annotations

import errno
import functools
from collections.abc import Callable
from typing import TypeVar

from ..errors import (
    ConcurrentUpdateError,
    ManifestError,
    RefExists,
    RefNotFound,
    StorageError,
    StorageFullError,
)
from ..format.layout import (
    HEADS,
    SEQ_WIDTH,
    TAGS,
    branch_dir,
    branch_seq,
    check_ref_name,
    is_commit_id,
    tag_key,
)
from ..storage import Storage

__all__ = ["Refs", "Tip"]

Tip = tuple[int, str]  # (sequence number, commit id)


def _encode(commit_id: str) -> bytes:
    return (commit_id + "\n").encode()


_TOMBSTONE = b"deleted\n"  # the newest file of a deleted branch: numbers never go back


def _decode(data: bytes, where: str) -> str | None:
    """The commit id of a ref file, or None for a deleted branch's tombstone."""
    if data == _TOMBSTONE:
        return None
    text = data.decode("ascii", errors="replace").strip()
    if not is_commit_id(text):
        raise ManifestError(f"ref file {where} is garbage ({data[:40]!r}); expected a commit id. "
                            "Delete it or restore it from a backup.")
    return text


F = TypeVar("F", bound=Callable)


def _full_disk(method: F) -> F:
    """A full disk while a ref file is written raises :class:`StorageFullError`, as commits do
    (nothing changed: a ref file is linked into place only once whole)."""
    what = method.__name__.replace("_", " ")

    @functools.wraps(method)
    def wrapped(self: Refs, name: str, *args: str, **kwargs: str) -> None:
        try:
            return method(self, name, *args, **kwargs)
        except OSError as e:
            if isinstance(e, StorageError) or e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise StorageFullError(
                f"no space left to {what} {name!r}: {e}. Nothing was changed: free space "
                "(store.gc() removes old commits and the leftovers of failed ones), then "
                f"{what} again.", key=e.filename, errno=e.errno) from e
    return wrapped  # type: ignore[return-value]


class Refs:
    """Branch and tag files of one store."""

    def __init__(self, storage: Storage):
        self.storage = storage

    # -- branches --------------------------------------------------------------------------
    def _seqs(self, branch: str) -> list[int]:
        names = self.storage.listdir(branch_dir(branch))
        # ASCII digits only: int() reads other Unicode digits, and their ref keys do not exist
        return sorted(int(n) for n in names if len(n) == SEQ_WIDTH and n.isascii() and n.isdigit())

    def _top(self, branch: str) -> tuple[int, str | None] | None:
        """The newest ref file: ``(seq, commit id or None for a tombstone)``, None if none."""
        seqs = self._seqs(branch)
        if not seqs:
            return None
        key = branch_seq(branch, seqs[-1])
        try:
            return seqs[-1], _decode(self.storage.read(key), key)
        except FileNotFoundError:  # pruned between listing and reading: look again
            return self._top(branch)

    def tip(self, branch: str) -> Tip | None:
        """``(seq, commit id)`` of the branch tip, or None if the branch does not exist."""
        top = self._top(branch)
        return top if top is not None and top[1] is not None else None

    def branches(self) -> dict[str, str]:
        """``{branch: tip commit id}``."""
        out = {}
        for name in self.storage.listdir(HEADS):
            try:
                tip = self.tip(name)
            except Exception:  # noqa: BLE001 - an invalid folder name is not a branch
                continue
            if tip is not None:
                out[name] = tip[1]
        return out

    def history(self, branch: str) -> list[str]:
        """The commits the branch's ref files name, newest move first (the moves gc has not
        pruned yet; tombstones and unreadable files are left out)."""
        out = []
        for seq in reversed(self._seqs(branch)):
            key = branch_seq(branch, seq)
            try:
                commit_id = _decode(self.storage.read(key), key)
            except (FileNotFoundError, ManifestError):
                continue
            if commit_id is not None:
                out.append(commit_id)
        return out

    def advance(self, branch: str, expected: Tip | None, commit_id: str) -> int:
        """Move ``branch`` from ``expected`` to ``commit_id``; return the new sequence number.

        Raises :class:`ConcurrentUpdateError` if another writer moved it first.
        """
        seq = 0 if expected is None else expected[0] + 1
        key = branch_seq(branch, seq)
        created = self.storage.put_if_absent(key, _encode(commit_id))
        if created:
            # gc prunes old ref files: a writer that read a long-gone tip can re-create a pruned
            # number below the real tip. A higher number means the branch moved on: undo.
            seqs = self._seqs(branch)
            if seqs and seqs[-1] > seq:
                self.storage.delete(key)
                created = False
        if not created:
            now = self.tip(branch)
            raise ConcurrentUpdateError(
                f"branch {branch!r} was moved by another writer (now at "
                f"{now[1][:12] if now else '?'}) while commit {commit_id[:12]} was written. "
                f"Nothing is lost: commit {commit_id} is stored. Commit again on the new tip, or "
                f"keep this one with store.branch(name, {commit_id[:12]!r}).",
                commit_id=commit_id, branch=branch)
        return seq

    @_full_disk
    def create_branch(self, branch: str, commit_id: str) -> None:
        check_ref_name(branch, "branch")
        exists = RefExists(f"branch {branch!r} already exists; choose another name or use "
                           "store.reset_branch() to move it")
        top = self._top(branch)
        if top is not None and top[1] is not None:
            raise exists
        try:  # after a tombstone: numbers go on above it, so stale writers stay below
            self.advance(branch, top, commit_id)
        except ConcurrentUpdateError:  # another writer created it first
            raise exists from None

    @_full_disk
    def reset_branch(self, branch: str, commit_id: str) -> None:
        """Point an existing branch at any commit (a new ref file: history of moves is kept)."""
        tip = self.tip(branch)
        if tip is None:
            raise RefNotFound(f"no branch {branch!r}")
        self.advance(branch, tip, commit_id)

    @_full_disk
    def delete_branch(self, branch: str) -> None:
        """Delete a branch: a tombstone above its tip (so a writer that saw the old tip cannot
        move it later), then the older ref files."""
        tip = self.tip(branch)
        if tip is None:
            raise RefNotFound(f"no branch {branch!r}")
        if not self.storage.put_if_absent(branch_seq(branch, tip[0] + 1), _TOMBSTONE):
            raise ConcurrentUpdateError(f"branch {branch!r} moved while it was being deleted; "
                                        "look at it again", branch=branch)
        for s in self._seqs(branch):
            if s <= tip[0]:
                self.storage.delete(branch_seq(branch, s))

    def prune_moves(self, branch: str, keep: int = 8) -> int:
        """Delete all but the newest ``keep`` ref files of a branch; return how many went."""
        seqs = self._seqs(branch)
        old = seqs[: max(len(seqs) - max(keep, 1), 0)]
        for s in old:
            self.storage.delete(branch_seq(branch, s))
        return len(old)

    # -- tags ------------------------------------------------------------------------------
    def tags(self) -> dict[str, str]:
        out = {}
        for name in self.storage.listdir(TAGS):
            if name.startswith("."):
                continue
            try:
                out[name] = self.tag(name)
            except (RefNotFound, ValueError):
                continue
        return out

    def tag(self, name: str) -> str:
        key = tag_key(name)
        try:
            commit_id = _decode(self.storage.read(key), key)
        except FileNotFoundError:
            raise RefNotFound(f"no tag {name!r}") from None
        if commit_id is None:
            raise ManifestError(f"tag file {key} is garbage; delete it or restore it")
        return commit_id

    @_full_disk
    def create_tag(self, name: str, commit_id: str) -> None:
        if not self.storage.put_if_absent(tag_key(name), _encode(commit_id)):
            raise RefExists(f"tag {name!r} already exists; delete it first "
                            "(store.delete_tag) or choose another name")

    def delete_tag(self, name: str) -> None:
        key = tag_key(check_ref_name(name, "tag"))
        if not self.storage.exists(key):
            raise RefNotFound(f"no tag {name!r}")
        self.storage.delete(key)
