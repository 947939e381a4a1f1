"""``ckptstore.open``: a location (a local path or any fsspec URL, and a local tier) opened as a
:class:`~ckptstore.store.Store` -- the storage made, the store's marker checked (or written into
an empty location), the options checked before anything is created."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from fsspec.implementations.cached import CachingFileSystem

from .commit.plan import EncodingOptions
from .errors import NotAStoreError
from .format.layout import MARKER
from .history.manifest import decode_marker, encode_marker
from .policy import Policy
from .policy.retention import Retention, check_retention
from .priority import DEFAULT_PRIORITY, check_priority
from .storage import FsspecStorage, LocalStorage, MemoryStorage, Retry, Storage, open_storage
from .commit.auto import helpers_start, sendable
from .commit.process import WorkerSpec
from .store import Store
from .tiers import Tiers
from .tiers.parts import read_rank
from .tiers.storage import TieredStorage

__all__ = ["open"]


def open(url: str | os.PathLike, create: bool = True, options: EncodingOptions | None = None,
         policy: Policy | None = None, io_workers: int | None = None, durable: bool = True,
         collective: bool = True, retry: Retry | None = None,
         staging_budget: int | None = None, background_priority: str = DEFAULT_PRIORITY,
         keep: Retention | None = None, local: str | os.PathLike | None = None,
         upload_budget: int | None = None, local_keep: Retention | None = None,
         background: str = "auto", **storage_options: Any) -> Store:
    """Open the store at ``url`` (a local path or any fsspec URL), creating it unless
    ``create=False``. ``durable=True`` (the default) makes a commit to a local store
    crash-consistent: its chunk files and folders, then its manifest, then its ref are fsynced
    in that order (a machine that loses power after a commit returned keeps it whole), and each
    chunk file's pages leave the page cache once on disk (a checkpoint is written once and read
    rarely: it does not evict what training reads; a tiered store's local tier keeps them for
    its uploader); ``durable=False`` opts out (faster commits; a power loss may then leave a ref
    naming data that never reached the disk). Object stores ignore it.

    ``io_workers`` bounds the threads that encode and write chunks (default:
    on local disks the CPUs this process may use divided by the ranks on the host,
    ``LOCAL_WORLD_SIZE``; 16 for object stores); lower it to leave cores to training.

    Raises :class:`NotAStoreError` if the location exists but holds something else, or is absent
    and ``create=False``; :class:`FormatVersionError` if a newer ckptstore wrote it.

    ``collective=False`` keeps ``commit`` a single-process call under ``torch.distributed``
    (e.g. when only rank 0 commits).

    ``staging_budget`` bounds (in bytes) the host staging buffers ``commit_async`` copies the
    state into (pinned for CUDA tensors): a commit that would need more raises
    :class:`StagingBudgetError` before anything is copied (default: no bound; the pool holds
    one copy of the latest state).

    ``background_priority`` is the CPU priority of ``commit_async``'s persist and of the threads
    that encode and write its chunks: ``"low"`` (the default: nice +10, a fair share of a busy
    core), ``"idle"`` (Linux ``SCHED_IDLE``: starves when other processes keep every core busy)
    or ``"normal"``; while the caller waits for a persist, or where its threads find themselves
    starved (no core left free), it runs at normal priority. See :mod:`ckptstore.priority`.

    ``retry`` (a :class:`ckptstore.Retry`) sets how object-store requests that fail with a
    transient error are repeated after the client's own retries (default ``Retry()``: 4
    attempts, backoff from 0.2 s capped at 5 s); local disks and ``memory://`` are not retried.
    ``keep`` (a retention rule: ``LatestN(3) | BestN(2, "loss") | EveryN(1000, key="step")``)
    is applied after each commit of this store lands, tags and branch tips always kept; see
    :mod:`ckptstore.policy.retention`.

    ``local`` (a local path) makes a tiered store (docs/tiers.md): commits land there and are
    uploaded to ``url`` in the background, in commit order; reads prefer the local tier.
    ``upload_budget`` bounds the bytes of commits waiting for upload (a commit then waits, with
    an :class:`~ckptstore.tiers.UploadBudgetWarning`); ``local_keep`` (a retention rule) is
    applied to the local tier after each upload lands, and ``keep`` (the rule of the store
    at ``url``, as without ``local=``) to the remote after each upload lands; neither deletes
    what a commit not uploaded yet needs.

    ``background``: ``commit_async`` persists in a process of the store's own (``"process"``: no
    GIL shared with training), on a thread, or (``"auto"``) the first where it can: docs/async.md.

    Other keywords (``storage_options``) go to fsspec.
    """
    check_priority(background_priority)  # before anything is created
    check_retention(keep)
    if local is None and (upload_budget is not None or local_keep is not None):
        raise TypeError("upload_budget= and local_keep= need local= (a tiered store)")
    storage = open_storage(url, durable=durable, retry=retry, **storage_options)  # writes nothing
    local_storage = None if local is None else _local_tier(local, durable)
    worker = _worker(storage, url, background, local_storage, {
        "durable": durable, "retry": retry, "io_workers": io_workers, "keep": keep},
        storage_options, collective)
    tiers = None
    if local_storage is None:
        storage = _opened(storage, url, create)
    else:  # a remote that does not answer yet: commits land locally, uploads wait for it
        remote = storage
        tiers = Tiers(_opened(local_storage, local, True), remote,
                      storage_options, upload_budget, local_keep,
                      lambda: _opened(remote, url, create), remote_keep=keep,
                      upload_process=_uploads(worker, background_priority))
        storage, keep = tiers.storage, None  # the remote's rule: applied after uploads
    return Store(storage, options, io_workers=io_workers, policy=policy, collective=collective,
                 staging_budget=staging_budget, background_priority=background_priority,
                 keep=keep, tiers=tiers, worker=worker)


def _local_tier(local: str | os.PathLike, durable: bool) -> Storage:
    """A tiered store's local tier, not checked yet (writes nothing)."""
    storage = open_storage(local, durable=durable)
    if isinstance(storage, LocalStorage):
        storage.keep_written = True  # the uploader reads each commit's chunks next
    return storage


def _worker(storage: Storage, url: str | os.PathLike, background: str, local: Storage | None,
            kwargs: dict[str, Any], storage_options: dict[str, Any], collective: bool = False
            ) -> WorkerSpec | None:
    """How a persist process opens the store at ``url`` (``storage``: as this process opened
    it; ``local``: a tiered store's local tier) with ``kwargs``: ``background="process"``, or
    ``"auto"`` for a store another process sees as this one does; None: a thread. A local store
    goes by its absolute root (a relative path, ``~`` or ``file://`` as this process resolved
    them, whatever its working folder is later); an fsspec store with the options its
    filesystem was made with (``fsspec.config`` set in this process's code included). A tiered
    store's persist process commits to its local tier over the remote (:func:`open_tier`); its
    journal and uploads stay with this process's :class:`~ckptstore.tiers.Tiers`, which copies
    each commit in an upload process (:func:`_uploads`)."""
    if background not in ("auto", "thread", "process"):
        raise ValueError(f"background must be 'auto', 'thread' or 'process', not {background!r}")
    # a caching URL (simplecache::s3://...) keeps what it read in this process: training's
    # store would not see the process's commits
    cached = isinstance(getattr(storage, "fs", None), CachingFileSystem)
    private = isinstance(storage, MemoryStorage)
    tier = local is not None and not isinstance(local, LocalStorage)
    if background == "thread" or (background == "auto" and (private or cached or tier)):
        return None
    if private or cached or tier:
        why = ("memory:// is private to this one" if private
               else "a caching URL keeps what it read in this one" if cached
               else "its local tier is not a local folder")
        raise ValueError(f"background='process' needs a store another process sees as this one "
                         f"does: {why}; use background='thread'")
    where = storage.root if isinstance(storage, LocalStorage) else os.fspath(url)
    options = (dict(storage.fs.storage_options) if isinstance(storage, FsspecStorage)
               else storage_options)
    if local is not None:
        kwargs = {k: v for k, v in kwargs.items() if k != "keep"}  # the remote's: after uploads
    return WorkerSpec(where, {**kwargs, **options}, background == "auto", collective,
                      None if local is None else local.root)


def _uploads(worker: WorkerSpec | None, priority: str) -> WorkerSpec | None:
    """How a tiered store's upload process opens its tiers, and its CPU priority: where its
    persist may run in a process (``background="process"``, or ``"auto"`` where helpers start
    and the storage options can be sent)."""
    if worker is None or worker.local is None:
        return None
    if worker.auto and not (helpers_start() and sendable(*worker.kwargs.values())):
        return None
    return replace(worker, kwargs={**worker.kwargs, "background_priority": priority})


def open_tier(url: str, local: str, options: EncodingOptions | None = None,
              policy: Policy | None = None, io_workers: int | None = None,
              durable: bool = True, retry: Retry | None = None,
              background_priority: str = DEFAULT_PRIORITY, **storage_options: Any) -> Store:
    """A tiered store as its persist process commits to it: the local tier at ``local`` (an
    absolute path, a store already) over the remote at ``url`` (not asked at open: its reads
    are the fallback of the local tier's), without a journal or uploads -- the store's own
    process queues each commit once it landed (``Tiers.queue_pending``)."""
    remote = open_storage(url, durable=durable, retry=retry, **storage_options)
    tier = _opened(_local_tier(local, durable), local, create=False)
    storage = TieredStorage(tier, remote, partial=read_rank(tier) is not None)
    return Store(storage, options, io_workers=io_workers, policy=policy, collective=False,
                 background_priority=background_priority)


def _opened(storage: Storage, url: str | os.PathLike, create: bool) -> Storage:
    """``storage`` once it holds a store (made unless ``create`` is False)."""
    try:
        decode_marker(storage.read(MARKER), storage.path(MARKER))
    except FileNotFoundError:
        if not create:
            raise NotAStoreError(f"no ckptstore at {url!s}: check the location (a store is "
                                 "created by ckptstore.open(url) without create=False)") from None
        # the marker itself may appear meanwhile: ranks of a job open a new store together
        leftovers = [n for n in storage.listdir("") if not n.startswith(".") and n != MARKER]
        if leftovers:
            raise NotAStoreError(
                f"{url!s} is not empty ({', '.join(leftovers[:5])}) and holds no ckptstore; "
                "choose an empty location") from None
        storage.put_if_absent(MARKER, encode_marker())
        decode_marker(storage.read(MARKER), storage.path(MARKER))
    return storage
