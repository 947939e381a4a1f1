"""A sharded commit on tiered stores (issue 29): every rank uploads its own part, then a
completion object; the coordinator publishes the remote manifest and ref only once every
rank's completion object is there.

Each rank of a process group has a local tier of its own (``.uploads/rank.json`` says whose;
two ranks sharing one folder is refused). Its part of a commit (the arrays it wrote into
``data/<commit>/``) is a journal record (``op="part"``) written once the part is durable
locally, before the coordinator moves any ref. Its upload copies the part's files, then puts::

    data/<commit>/.parts/<rank>    JSON {"v": 1, "rank": r, "world": n, "time": t}

The coordinator (rank 0) uploads its own part the same way, then polls (with backoff) until
``.parts/`` lists every rank of ``world``, then puts the manifest, moves the remote ref and
creates the tags, as :mod:`.copy` does for a commit of one process. A reader of the remote thus
never sees a commit with a rank's data missing. Everything is idempotent (files and completion
objects present are skipped), so a record resumed after a kill simply runs again. A
coordinator's record whose manifest never reached its local tier is a commit that never
happened (the save failed before ``finish``): it is dropped; a rank's orphan part, uploaded
anyway, is unreferenced data that gc removes after its grace period. Completion objects live
inside the commit's data folder: gc deletes them with it, readers and ``verify`` never look at
names starting with ``.``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from ..errors import TierError, UploadError
from ..format.layout import MARKER, data_dir, manifest_key
from ..storage import Storage
from .copy import Sent, copy_folder, copy_tags, local_manifest, move_ref
from .journal import JOURNAL, Record

__all__ = ["PARTS", "RankInfo", "claim_rank", "part_key", "parts_up", "publish_parts",
           "read_rank", "upload_part", "wait_parts"]

PARTS = ".parts"
_RANK = f"{JOURNAL}/rank.json"
_VERSION = 1
_MAX_DELAY = 1.0  # seconds between two listings of the completion objects, at most


@dataclass(frozen=True)
class RankInfo:
    """The rank a local tier belongs to, of a process group of ``world`` ranks."""

    rank: int
    world: int


def part_key(commit: str, rank: int) -> str:
    """The completion object of ``rank``'s part of ``commit`` on the remote."""
    return f"{data_dir(commit)}/{PARTS}/{rank}"


def read_rank(local: Storage) -> RankInfo | None:
    """The rank whose local tier ``local`` is (None: one process's)."""
    try:
        doc = json.loads(local.read(_RANK))
        return RankInfo(int(doc["rank"]), int(doc["world"]))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as e:
        raise TierError(f"{local.path(_RANK)} is damaged ({e}); write "
                        '{"version": 1, "rank": R, "world": N} with this node\'s rank') from None


def claim_rank(local: Storage, rank: int, world: int) -> RankInfo:
    """Mark ``local`` as rank ``rank``'s local tier (a process group of ``world``); raises
    :class:`TierError` when another rank's it is (ranks may not share a local folder)."""
    doc = json.dumps({"version": _VERSION, "rank": rank, "world": world}).encode()
    if not local.put_if_absent(_RANK, doc):
        mine = read_rank(local)
        if mine is not None and mine.rank != rank:
            raise TierError(
                f"the local tier {local.url} belongs to rank {mine.rank}, and rank {rank} "
                "commits into it: give each rank a local folder of its own, e.g. "
                "local=f'/nvme/ckpts/rank{torch.distributed.get_rank()}'")
        if mine is None or mine.world != world:
            local.put(_RANK, doc)
    return RankInfo(rank, world)


def parts_up(remote: Storage, commit: str) -> set[int]:
    """The ranks whose part of ``commit`` is complete on the remote."""
    names = remote.listdir(f"{data_dir(commit)}/{PARTS}")
    return {int(n) for n in names if n.isascii() and n.isdigit()}


def upload_part(local: Storage, remote: Storage, rec: Record, executor: Executor, sent: Sent,
                stop: Callable[[], bool]) -> None:
    """Rank ``rec.rank``'s part of ``rec.commit`` (and of the commits it builds on whose part
    of this rank is not up), then its completion object."""
    remote.put_if_absent(MARKER, local.read(MARKER))
    _part(local, remote, rec.commit, rec.rank, rec.world, executor, sent, stop, set())


def _part(local: Storage, remote: Storage, commit: str, rank: int, world: int,
          executor: Executor, sent: Sent, stop: Callable[[], bool], seen: set[str]) -> None:
    seen.add(commit)
    key = part_key(commit, rank)
    if remote.exists(key) or remote.exists(manifest_key(commit)):
        return
    if local.exists(manifest_key(commit)):  # a rank killed before it adopted it: not there
        m = local_manifest(local, commit)
        for other in sorted((m.base_commits() | m.data_commits()) - seen):
            if local.exists(manifest_key(other)):
                _part(local, remote, other, rank, world, executor, sent, stop, seen)
    copy_folder(local, remote, data_dir(commit), executor, sent, stop)
    doc = {"v": _VERSION, "rank": rank, "world": world, "time": time.time()}
    remote.put_if_absent(key, json.dumps(doc).encode())


def wait_parts(remote: Storage, commit: str, world: int, stop: Callable[[], bool],
               timeout: float) -> None:
    """Return once every rank's part of ``commit`` is up; raises :class:`UploadError` after
    ``timeout`` seconds, ``InterruptedError`` once ``stop()``."""
    deadline, delay = time.monotonic() + timeout, 0.02
    while True:
        missing = sorted(set(range(world)) - parts_up(remote, commit))
        if not missing:
            return
        if stop():
            raise InterruptedError("upload stopped")
        left = deadline - time.monotonic()
        if left <= 0:
            raise UploadError(
                f"rank(s) {missing} of {world} have not uploaded their part of commit "
                f"{commit[:12]} to {remote.url} after {timeout:g} s (no "
                f"{part_key(commit, missing[0])}); nothing of the commit is visible remotely. "
                "Their uploads resume when their process opens its local tier again (or "
                "`ckpt push LOCAL_PATH` on their node); store.push() here then publishes it",
                commit_id=commit)
        time.sleep(min(delay, left))
        delay = min(delay * 2, _MAX_DELAY)


def publish_parts(local: Storage, remote: Storage, rec: Record, executor: Executor,
                  sent: Sent, stop: Callable[[], bool], timeout: float) -> bool:
    """The coordinator's upload of ``rec``: its own part, then, once every rank's part is up,
    the manifest, the remote ref and tags (a base not on the remote first, the same way).
    False: the commit never reached this local tier (its save failed), nothing to publish."""
    if not local.exists(manifest_key(rec.commit)):
        return False
    remote.put_if_absent(MARKER, local.read(MARKER))
    _publish(local, remote, rec.commit, rec.world, executor, sent, stop, timeout, set())
    move_ref(remote, local_manifest(local, rec.commit), rec.branch)
    copy_tags(local, remote, rec.commit)
    return True


def _publish(local: Storage, remote: Storage, commit: str, world: int, executor: Executor,
             sent: Sent, stop: Callable[[], bool], timeout: float, seen: set[str]) -> None:
    seen.add(commit)
    if remote.exists(manifest_key(commit)):
        return
    m = local_manifest(local, commit)
    for other in sorted((m.base_commits() | m.data_commits()) - seen):
        if local.exists(manifest_key(other)):
            _publish(local, remote, other, world, executor, sent, stop, timeout, seen)
    _part(local, remote, commit, 0, world, executor, sent, stop, set(seen))
    wait_parts(remote, commit, world, stop, timeout)
    if stop():
        raise InterruptedError("upload stopped")
    data = local.read(manifest_key(commit))
    remote.put_if_absent(manifest_key(commit), data)
    sent(len(data))
