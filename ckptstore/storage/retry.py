"""Bounded retries of back-end requests, and the translation of what is left into ckptstore errors.

Every request :class:`~ckptstore.storage.fsspec.FsspecStorage` makes is safe to repeat: reads,
listings and deletes are idempotent, chunks and metadata are immutable once written (a repeated
PUT writes the same bytes), and a repeated put-if-absent whose first attempt may have landed is
recognised by the caller (``fsspec.py`` says how). The clients retry first (botocore: 5 attempts
on 5xx, throttling and dropped connections); :class:`Retry` adds a few attempts around what still
escapes them, for back-ends whose clients retry less, and long outages. Errors that no retry cures
(a missing key, a key that exists, access denied, a full disk) are never retried.
"""

from __future__ import annotations

import errno
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..errors import InvalidRetry, StorageError, StorageFullError

__all__ = ["Retry", "is_transient", "storage_error"]

T = TypeVar("T")

_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
_PERMANENT = _FULL | {errno.EACCES, errno.EPERM, errno.EROFS, errno.EINVAL, errno.ENAMETOOLONG,
                      errno.EISDIR, errno.ENOTDIR, errno.EMSGSIZE}
_ANSWERS = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError,
            NotADirectoryError)  # the back-end answered: part of the protocol, not a fault


def is_transient(error: BaseException) -> bool:
    """Whether another attempt may succeed: server errors, timeouts, dropped connections."""
    if isinstance(error, (StorageError, *_ANSWERS)):
        return False
    if isinstance(error, OSError):
        return error.errno not in _PERMANENT
    # client libraries' own exception trees (botocore, aiohttp, requests) do not derive from
    # OSError; anything else that is not a programming error is taken as a network fault
    return isinstance(error, Exception) and not isinstance(
        error, (TypeError, ValueError, AttributeError, KeyError, NotImplementedError,
                AssertionError))


def storage_error(error: BaseException, what: str, key: str, attempts: int) -> StorageError:
    """The ckptstore error for a request that failed for good."""
    code = getattr(error, "errno", None)
    tries = f" (after {attempts} attempts)" if attempts > 1 else ""
    if code in _FULL:
        return StorageFullError(
            f"no space left to {what} {key}{tries}: {error}. Free space (store.gc() removes old "
            "commits and the leftovers of failed ones), then commit again.", key=key, errno=code)
    return StorageError(f"could not {what} {key}{tries}: {type(error).__name__}: {error}. "
                        "Check the storage endpoint and credentials, then try again.",
                        key=key, errno=code)


@dataclass(frozen=True)
class Retry:
    """How often and how patiently a failed request to an object store is repeated.

    Pass one to ``ckptstore.open(url, retry=...)`` (or :func:`~ckptstore.storage.open_storage`,
    :class:`~ckptstore.storage.FsspecStorage`). Local disks and ``memory://`` are not retried.

    Parameters
    ----------
    attempts
        Tries in all, an integer >= 1 (1: no retry).
    backoff
        Seconds before the second try (>= 0); doubled before each next one, with full jitter.
    max_backoff
        Cap of one wait, seconds (>= 0).

    Raises
    ------
    InvalidRetry
        (a :class:`~ckptstore.CkptStoreError` and ``ValueError``) for values out of range.

    Examples
    --------
    >>> Retry(attempts=8, backoff=0.5, max_backoff=30)
    Retry(attempts=8, backoff=0.5, max_backoff=30)
    >>> Retry(attempts=0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ckptstore.errors.InvalidRetry: Retry(attempts=0): attempts must be an integer >= 1 ...
    """

    attempts: int = 4
    backoff: float = 0.2
    max_backoff: float = 5.0

    def __post_init__(self) -> None:
        def bad(name: str, rule: str) -> InvalidRetry:
            return InvalidRetry(f"Retry({name}={getattr(self, name)!r}): {name} must be {rule}")

        def number(value: object) -> bool:
            return isinstance(value, (int, float)) and not isinstance(value, bool)

        if not (number(self.attempts) and isinstance(self.attempts, int) and self.attempts >= 1):
            raise bad("attempts", "an integer >= 1 (1: no retry)")
        for name in ("backoff", "max_backoff"):
            value = getattr(self, name)
            if not (number(value) and math.isfinite(value) and value >= 0):
                raise bad(name, "a finite number of seconds >= 0")

    def call(self, fn: Callable[[int], T], what: str, key: str) -> T:
        """``fn(attempt)`` (attempt counts from 1) until it returns; transient errors are
        retried, the last one raised as :class:`StorageError`; other errors pass unchanged."""
        for attempt in range(1, self.attempts + 1):
            try:
                return fn(attempt)
            except Exception as e:  # sorted by is_transient
                if not is_transient(e):
                    if isinstance(e, OSError) and getattr(e, "errno", None) in _FULL:
                        raise storage_error(e, what, key, attempt) from e
                    raise
                if attempt == self.attempts:
                    raise storage_error(e, what, key, attempt) from e
            wait = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
            time.sleep(random.uniform(0, wait))
        raise AssertionError("unreachable")
