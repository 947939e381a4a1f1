"""Garbage collection: retention policy, then mark and sweep with a grace period.

Mark: the retained commits are, per branch, the newest ``keep_last`` along the first-parent line
(all when None), every commit whose generation is a multiple of ``keep_every``, tagged commits
(``keep_tags``), a dangling line that continues a branch tip (:mod:`ckptstore.maintenance.dangling`: a
lost ref file's commits, verify reports them) while its newest commit is within the grace period,
and -- transitively -- every base commit a retained chain entry (incremental, consecutive, delta)
builds on. Every data folder a retained commit reads is live. Sweep: manifests first, then
data, so a crash half-way leaves only more leftovers. Commits and data that no ref reaches (a
crashed or lost commit) are removed only once older than ``grace_period`` seconds, so a commit in
flight in another process is never touched (git prunes its dangling objects the same way).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from ..chains.walk import Walk
from .dangling import find_dangling
from ..format.ids import commit_time, is_commit_id
from ..info import GCResult
from ..format.layout import COMMITS, DATA, HEADS, TAGS, TEMP_PREFIX, data_dir, manifest_key
from ..progress import bar
from ..history.repository import Repository

__all__ = ["collect"]


def _retained(repo: Repository, walk: Walk, keep_last: int | None, keep_tags: bool,
              keep_every: int | None, young: Callable[[str], bool], protect: set[str]
              ) -> tuple[set[str], set[str]]:
    """(retained commits, every commit reachable from a ref); ``protect``: the commits of
    ``protect`` this store holds."""
    reachable = set(repo.reachable())
    keep: set[str] = set(protect)
    for tip in repo.refs.branches().values():
        line = repo.reachable([tip])  # newest first along first parents
        keep.update(line if keep_last is None else line[: max(keep_last, 1)])
        if keep_every:
            keep.update(c for c in line if repo.summary(c).generation % keep_every == 0)
    if keep_tags:
        keep.update(c for c in repo.refs.tags().values() if c in reachable)
    for lost in find_dangling(repo, set(reachable)):  # a lost ref file's line: kept whole,
        if young(lost.line[0]):  # with its bases, while its newest commit is in its grace period
            keep.update(lost.line)
    stack = list(keep)  # chain entries need their bases, and each kept base stays restorable
    while stack:
        for base in walk.commits_read(repo.manifest(stack.pop())) - keep:
            keep.add(base)
            stack.append(base)
    return keep, reachable


def collect(repo: Repository, keep_last: int | None = None, keep_tags: bool = True,
            keep_every: int | None = None, dry_run: bool = False,
            grace_period: float = 3600.0, progress: bool = False,
            protect: Iterable[str] = ()) -> GCResult:
    """Apply the retention policy and delete what nothing needs; see the module docstring.

    ``protect``: commits kept whatever the policy says, with what they read (a tiered store's
    commits not uploaded yet, and on its remote what they read); the data folder of a protected
    commit whose manifest this store lacks is kept too (an upload under way).

    ``progress`` shows bars on stderr: commits and data folders scanned (each removable folder
    is listed to count its bytes), then refs, manifests and folders removed.
    """
    if keep_last is not None and keep_last < 1:
        raise ValueError("keep_last must be at least 1 (a branch tip is always kept)")
    if keep_every is not None and keep_every < 1:
        raise ValueError("keep_every must be a positive number of commits")
    storage = repo.storage
    now = time.time()
    walk = Walk(repo.manifest)

    def old(commit_id: str) -> bool:
        return commit_time(commit_id) + grace_period <= now

    all_commits = repo.commit_ids()
    protect = set(protect)
    keep, reachable = _retained(repo, walk, keep_last, keep_tags, keep_every,
                                lambda c: not old(c), protect & set(all_commits))
    # keep is closed under chain bases: the folders of its commits' own entries are every folder
    # they read
    live_data = {d for c in keep for d in repo.manifest(c).data_commits()} | protect

    result = GCResult(dry_run=dry_run, kept=sorted(keep))
    data_folders = storage.listdir(DATA)
    with bar(len(all_commits) + len(data_folders), "gc: scan", progress, unit="item") as shown:
        for c in all_commits:
            shown.update()
            if c in keep or (c not in reachable and not old(c)):
                continue
            result.commits_removed.append(c)
            result.bytes_freed += storage.size(manifest_key(c))
        for name in data_folders:
            shown.update()
            if not is_commit_id(name) or name in live_data:
                continue
            if name in result.commits_removed or (name not in all_commits and old(name)):
                result.data_removed.append(name)
                result.bytes_freed += sum(storage.walk_sizes(data_dir(name)).values())
    removed = set(result.commits_removed)
    result.tags_removed = sorted(t for t, c in repo.refs.tags().items() if c in removed)
    if dry_run:
        return result

    n = len(result.tags_removed) + len(result.commits_removed) + len(result.data_removed)
    with bar(n, "gc: remove", progress and n > 0, unit="item") as shown:
        for t in result.tags_removed:
            repo.refs.delete_tag(t)
            shown.update()
        for c in result.commits_removed:
            storage.delete(manifest_key(c))
            repo.forget(c)
            shown.update()
        for d in result.data_removed:
            storage.delete_tree(data_dir(d))
            shown.update()
    for branch in repo.refs.branches():
        result.ref_files_removed += repo.refs.prune_moves(branch)
    _remove_temp_files(repo, grace_period, now)
    return result


def _remove_temp_files(repo: Repository, grace_period: float, now: float) -> None:
    """Temporary files of interrupted local writes (``.tmp-*``)."""
    storage = repo.storage
    dirs = [COMMITS, TAGS, ""] + [f"{HEADS}/{b}" for b in storage.listdir(HEADS)]
    for d in dirs:
        for name in storage.listdir(d):
            if name.startswith(TEMP_PREFIX):
                key = f"{d}/{name}" if d else name
                mtime = storage.mtime(key)
                if mtime is not None and mtime + grace_period <= now:
                    storage.delete(key)
