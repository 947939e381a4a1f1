"""Where a store's bytes live: one protocol, one implementation per kind of back-end.

:func:`open_storage` picks the implementation for a URL: a local path (or ``file://`` URL) gets
:class:`LocalStorage`, ``memory://`` gets :class:`MemoryStorage`, every other fsspec URL
(``s3://``, ``gs://``, ``az://``, ...) gets :class:`FsspecStorage`. To add a back-end, subclass
:class:`Storage` (``base.py`` says what each primitive guarantees), choose it here, and add it
to ``BACKENDS`` in ``tests/conftest.py`` so the contract suite
(``tests/contract/test_storage.py``) and the behaviour suites run against it.

May import: the top-level helpers (errors, limits, info, priority, progress, _version) only.
"""

from __future__ import annotations

import os
from typing import Any

from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from ..errors import InvalidRetry
from .base import TEMP_PREFIX, Buffer, Storage
from .fsspec import FsspecStorage
from .local import LocalStorage
from .memory import MemoryStorage
from .retry import Retry

__all__ = ["TEMP_PREFIX", "Buffer", "FsspecStorage", "LocalStorage", "MemoryStorage", "Retry",
           "Storage", "open_storage"]


def open_storage(url: str | os.PathLike, durable: bool = False, retry: Retry | None = None,
                 **storage_options: Any) -> Storage:
    """The storage of the store root at ``url``.

    Parameters
    ----------
    url
        Local path or fsspec URL (``memory://run1``, ``s3://bucket/prefix``).
    durable
        Fsync every chunk file on local disks (see :attr:`Storage.durable`).
    retry
        How requests that fail with a transient error are repeated on object stores (default
        ``Retry()``: 4 attempts, backoff from 0.2 s capped at 5 s; ``Retry(attempts=1)``: none,
        the client's own retries only). Local disks and ``memory://`` are not retried.
    storage_options
        Passed to fsspec (e.g. ``endpoint_url``, ``key``, ``secret`` for S3).
    """
    if retry is not None and not isinstance(retry, Retry):
        raise InvalidRetry(f"retry={retry!r}: pass a ckptstore.Retry(attempts=..., backoff=...) "
                           "or None (the default policy)")
    url = os.fspath(url)
    fs, root = url_to_fs(url, **storage_options)
    if isinstance(fs, LocalFileSystem):
        return LocalStorage(root, url=url, durable=durable)
    if isinstance(fs, MemoryFileSystem):
        return MemoryStorage(fs, root, url=url, durable=durable)
    return FsspecStorage(fs, root, url=url, durable=durable, retry=retry)
