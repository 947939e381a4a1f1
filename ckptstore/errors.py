"""The ckptstore exception tree.

Every error the library raises on purpose derives from :class:`CkptStoreError`, and also from the
builtin a caller would already catch (``KeyError`` for a missing name, ``ValueError`` for bad
input)::

    CkptStoreError
    ├── NotAStoreError (FileNotFoundError)      the URL holds no ckptstore
    ├── FormatVersionError                       written by a newer ckptstore
    ├── RefError (ValueError)
    │   ├── InvalidRefName                       a name with '..', '/', '~' ...
    │   ├── RefNotFound (KeyError)               unknown branch, tag, commit or prefix
    │   ├── AmbiguousRef                         an id prefix matching several commits
    │   └── RefExists                            a tag or branch of that name exists
    ├── ConcurrentUpdateError                    a branch moved while committing
    ├── UnsupportedLeafError (TypeError)         an object in the state that cannot be stored
    ├── StateMismatchError (ValueError)          paths= or into= that do not fit a commit's state
    ├── CorruptionError (ValueError)
    │   ├── ManifestError                        truncated / invalid commit manifest or ref file
    │   └── CorruptedChunkError                  a chunk failed its checksum or is missing
    ├── PendingCommitError (RuntimeError)        a background persist failed
    │   └── PersistProcessError                  a persist process failed or was refused
    ├── TierError (ValueError)                   a tier the store does not have (gc, uploads)
    ├── StagingBudgetError (MemoryError)         commit_async would need more staging than allowed
    ├── AllocationError (MemoryError)            an array a manifest declares cannot be allocated
    ├── StorageError (OSError)                   the back-end failed a request, after retries
    │   ├── StorageFullError                     no space left (ENOSPC, EDQUOT)
    │   ├── UploadError                          a tiered store's upload to its remote failed
    │   └── UnsafeFileError                      a FIFO, device, link out of the root
    ├── InvalidRetry (ValueError)                a Retry policy with values out of range
    ├── InvalidSetting (ValueError)              an environment variable set to a value it lacks
    ├── ExportError (ValueError)                 an export file that cannot be written
    ├── ImportSourceError (ValueError)           a source `ckpt import` refuses (crafted, damaged)
    └── DistributedError (RuntimeError)          a sharded commit or load across ranks failed
"""

from __future__ import annotations

__all__ = [
    "AllocationError",
    "AmbiguousRef",
    "CkptStoreError",
    "ConcurrentUpdateError",
    "CorruptedChunkError",
    "CorruptionError",
    "DistributedError",
    "FormatVersionError",
    "InvalidRefName",
    "InvalidRetry",
    "InvalidSetting",
    "ManifestError",
    "NotAStoreError",
    "PendingCommitError",
    "PersistProcessError",
    "ExportError",
    "ImportSourceError",
    "RefError",
    "RefExists",
    "RefNotFound",
    "StagingBudgetError",
    "StorageError",
    "StorageFullError",
    "StateMismatchError",
    "TierError",
    "UnsafeFileError",
    "UnsupportedLeafError",
    "UploadError",
]


class CkptStoreError(Exception):
    """Base class of every error ckptstore raises on purpose."""


class NotAStoreError(CkptStoreError, FileNotFoundError):
    """The location holds no ckptstore (``ckptstore.open(url)`` without ``create=False`` makes one)."""


class FormatVersionError(CkptStoreError):
    """The store was written by a newer format version than this library reads."""


class RefError(CkptStoreError, ValueError):
    """Base class of ref (branch, tag, commit id) errors."""


class InvalidRefName(RefError):
    """A branch or tag name that is not allowed."""


class RefNotFound(RefError, KeyError):
    """No branch, tag or commit answers to that name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class AmbiguousRef(RefError):
    """A commit id prefix that matches more than one commit."""


class RefExists(RefError):
    """A branch or tag of that name already exists."""


class ConcurrentUpdateError(CkptStoreError):
    """Another writer moved the branch while this commit was written.

    The commit's data and manifest are stored (``commit_id``); nothing is lost. Retry the commit on
    the new tip, or attach the orphan with ``store.branch(name, err.commit_id)``.
    """

    def __init__(self, message: str, commit_id: str | None = None, branch: str | None = None):
        super().__init__(message)
        self.commit_id = commit_id
        self.branch = branch


class UnsupportedLeafError(CkptStoreError, TypeError):
    """An object in the state that ckptstore cannot store without pickling."""


class StateMismatchError(CkptStoreError, ValueError):
    """``checkout``'s ``paths=`` or ``into=`` do not fit the commit: a pattern that selects
    nothing or is not understood, a live entry the commit lacks, or a tensor of another shape."""


class CorruptionError(CkptStoreError, ValueError):
    """Stored bytes that fail validation."""


class ManifestError(CorruptionError):
    """A commit manifest, ref file or store marker that is truncated, corrupted or invalid."""


class CorruptedChunkError(CorruptionError):
    """A chunk of a stored array is missing or failed its checksum; ``path`` names it."""

    def __init__(self, message: str, path: str | None = None):
        super().__init__(message)
        self.path = path


class PendingCommitError(CkptStoreError, RuntimeError):
    """A background persist failed; the commit was not made."""


class PersistProcessError(PendingCommitError):
    """A store's persist process (``open(..., background="process")``) exited or could not be
    given what a commit needs (a configuration object it cannot receive); the
    commit was not made."""


class TierError(CkptStoreError, ValueError):
    """A tier the store does not have: ``gc(tier="remote")`` or ``wait_uploaded`` on a store of
    one tier (``ckptstore.open(url)`` without ``local=``), or a tier name other than
    ``"local"`` and ``"remote"``; or, under a process group, a tier that is not this rank's:
    a local folder another rank commits into, ``gc(tier="remote")`` on a rank other than the
    coordinator."""


class StagingBudgetError(CkptStoreError, MemoryError):
    """``commit_async`` would hold more host staging memory than ``ckptstore.open(...,
    staging_budget=...)`` allows; nothing was copied or written."""


class AllocationError(CkptStoreError, MemoryError):
    """A read needs more memory for an array than this process can allocate: check out fewer
    tensors (``paths=``) or on a larger machine; from a store you do not trust, the manifest
    may be hostile (``verify`` reports what the store holds)."""


class StorageError(CkptStoreError, OSError):
    """The back-end failed a read or write, after the retries that are safe; ``key`` names it.

    A commit that fails with it made nothing visible: its branch is where it was, and the
    partial data is removed by ``store.gc()`` once older than the grace period."""

    def __init__(self, message: str, key: str | None = None, errno: int | None = None):
        super().__init__(message)
        self.key = key
        if errno is not None:
            self.errno = errno


class StorageFullError(StorageError):
    """No space left where the store lives (``ENOSPC``/``EDQUOT``): free space, then retry."""


class UploadError(StorageError):
    """A tiered store (``ckptstore.open(url, local=...)``) could not upload a commit to its
    remote after the storage layer's retries; ``commit_id`` names it. The commit is safe on the
    local tier and still queued; nothing of it is visible remotely: ``store.push()`` (or
    ``ckpt push``) tries again."""

    def __init__(self, message: str, commit_id: str | None = None, key: str | None = None,
                 errno: int | None = None):
        super().__init__(message, key=key, errno=errno)
        self.commit_id = commit_id


class UnsafeFileError(StorageError):
    """A local store's key is not a regular file or folder inside the store's root (a FIFO, a
    device, a socket, a link loop or a link leading out of the root): refused, never read nor
    written through. Remove it, or restore the file from a copy."""


class InvalidRetry(CkptStoreError, ValueError):
    """A :class:`~ckptstore.storage.Retry` policy with values out of range (raised when it is
    made, or when something else is passed as one)."""


class InvalidSetting(CkptStoreError, ValueError):
    """An environment variable ckptstore reads (``CKPTSTORE_DURABILITY``) set to a value it does
    not know: the message lists the values it takes."""


class ExportError(CkptStoreError, ValueError):
    """An export that cannot be written: the file exists, its folder is missing, or two tensors
    would get the same key."""


class ImportSourceError(CkptStoreError, ValueError):
    """A source that cannot be imported: unknown format, missing or malformed files, a path that
    leaves the source folder, or a file that would need pickle to load."""


class DistributedError(CkptStoreError, RuntimeError):
    """A sharded commit or load across ranks cannot go on: a rank failed, the ranks disagree,
    or a stored value would need unpickling."""
