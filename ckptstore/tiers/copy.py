"""Copy one commit of the local tier to the remote: chunks, then manifest, then ref, then tags.

The remote is a store of the same format, so an upload is a copy key for key through the
:class:`~ckptstore.storage.Storage` protocol. The order makes a remote reader's view whole: a
ref names a commit only once its manifest is there, and a manifest is written only once every
chunk it names (and every commit it builds on: chain bases, data it shares) is there. Each step
skips what the remote already holds, so a copy interrupted anywhere simply runs again.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, wait

from ..errors import RefExists, UploadError
from ..format.layout import MARKER, data_dir, manifest_key
from ..history.manifest import Manifest, decode_manifest
from ..history.refs import Refs
from ..storage import Storage

__all__ = ["copy_commit", "copy_folder", "copy_tags", "local_manifest", "move_ref"]

Sent = Callable[[int], None]
"""Called with the bytes of each key copied (upload progress)."""


def copy_commit(local: Storage, remote: Storage, commit: str, branch: str | None,
                executor: Executor, sent: Sent, stop: Callable[[], bool]) -> None:
    """Make ``commit`` whole on the remote and, with ``branch``, move the remote branch to it
    and create its local tags there. ``stop()`` true between keys abandons the copy (nothing
    of it becomes visible)."""
    m = local_manifest(local, commit)
    remote.put_if_absent(MARKER, local.read(MARKER))  # a remote that was not there at open
    _copy_objects(local, remote, m, executor, sent, stop, seen=set())
    if branch is not None:
        move_ref(remote, m, branch)
        copy_tags(local, remote, commit)


def local_manifest(storage: Storage, commit: str) -> Manifest:
    key = manifest_key(commit)
    return decode_manifest(storage.read(key), storage.path(key))


def _copy_objects(local: Storage, remote: Storage, m: Manifest, executor: Executor,
                  sent: Sent, stop: Callable[[], bool], seen: set[str]) -> None:
    """The data ``m`` reads and every commit it builds on, then ``m``'s manifest."""
    seen.add(m.id)
    for other in sorted((m.base_commits() | m.data_commits()) - seen):
        if other in seen or remote.exists(manifest_key(other)):
            seen.add(other)
            continue
        _copy_objects(local, remote, local_manifest(local, other), executor, sent, stop, seen)
    for d in sorted(m.data_commits() | {m.id}):
        copy_folder(local, remote, data_dir(d), executor, sent, stop)
    if stop():
        raise InterruptedError("upload stopped")
    data = local.read(manifest_key(m.id))
    remote.put_if_absent(manifest_key(m.id), data)
    sent(len(data))


def copy_folder(local: Storage, remote: Storage, folder: str, executor: Executor, sent: Sent,
                 stop: Callable[[], bool]) -> None:
    """Every file of ``folder`` the remote lacks (present there = complete on an object store,
    which writes a key whole; on a local-disk remote, where a killed copy can leave a file
    short under its name, one of another size than the local file's is copied again)."""
    have = remote.walk_sizes(folder)
    keys = list(local.walk_sizes(folder))
    missing = [k for k in keys if k not in have]
    if remote.local_disk:  # walk_sizes shares a linked file's size out: compare whole sizes
        missing += [k for k in keys if k in have and remote.size(k) != local.size(k)]

    def one(key: str) -> None:
        if stop():
            return
        data = local.read_chunk(key)
        remote.put_chunk(key, data)
        sent(memoryview(data).nbytes)

    copies = [executor.submit(one, k) for k in missing]
    try:
        for f in copies:
            f.result()
    except BaseException:  # no copy of this attempt goes on (or reports progress) after it
        for f in copies:
            f.cancel()
        wait(copies)
        raise
    if stop():
        raise InterruptedError("upload stopped")
    if missing:  # a local folder's files and entries durable before a manifest names them
        remote.fsync_dir(folder)  # (a folder copied whole before was made durable then)


def move_ref(remote: Storage, m: Manifest, branch: str) -> None:
    """Move the remote ``branch`` to ``m`` from its parent (or create it); nothing when the
    remote branch already names ``m`` (an upload that ran before)."""
    refs = Refs(remote)
    tip = refs.tip(branch)
    if tip is not None and tip[1] == m.id:
        return
    if tip is None or tip[1] == m.parent:
        refs.advance(branch, tip, m.id)
        return
    if m.id in refs.history(branch):
        return
    raise UploadError(
        f"the remote branch {branch!r} is at {tip[1][:12]}, not at the parent of commit "
        f"{m.id[:12]} ({(m.parent or 'none')[:12]}): another writer moved it. The commit is "
        f"uploaded but no remote ref names it; attach it there with "
        f"ckptstore.open(remote).branch(name, {m.id[:12]!r})", commit_id=m.id)


def copy_tags(local: Storage, remote: Storage, commit: str | None = None) -> None:
    """The local tags naming ``commit`` (None: any commit the remote holds whole), created on
    the remote; a tag there already naming that commit is fine."""
    local_refs, remote_refs = Refs(local), Refs(remote)
    remote_tags = remote_refs.tags() if commit is None else {}
    for name, target in local_refs.tags().items():
        if (target != commit if commit is not None else
                remote_tags.get(name) == target or not remote.exists(manifest_key(target))):
            continue
        try:
            remote_refs.create_tag(name, target)
        except RefExists:
            if remote_refs.tag(name) != target:
                raise UploadError(f"tag {name!r} names another commit on the remote; commit "
                                  f"{target[:12]} is uploaded without it", commit_id=target
                                  ) from None
