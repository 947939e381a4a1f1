"""Exit statuses of ``ckpt``, in one place, and which error gets which.

====  =======================================================================================
0     success
1     ``verify`` found problems; ``diff --exit-code`` found differences
2     bad usage, or an error no other status names (e.g. a tag that already exists)
3     not found: no store at the URL, an unknown or ambiguous ref, an invalid ref name
4     the store is corrupted: a manifest, ref file or chunk fails validation
5     the storage failed: unreachable endpoint, timeout, permission denied, I/O error
130   interrupted (Ctrl-C)
141   stdout closed early (``ckpt log URL | head``)
====  =======================================================================================

Statuses 0, 1, 2 and 130 mean what they meant before 3, 4 and 5 were split out of 2.
"""

from __future__ import annotations

from ..errors import CorruptionError, NotAStoreError, RefError, RefExists

__all__ = ["EXIT_CORRUPT", "EXIT_DIFFERS", "EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_NOT_FOUND",
           "EXIT_OK", "EXIT_PIPE", "EXIT_STORAGE", "EXIT_USAGE", "exit_status"]

EXIT_OK = 0
EXIT_DIFFERS = 1  # verify found problems; diff --exit-code found differences
EXIT_ERROR = 2
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_CORRUPT = 4
EXIT_STORAGE = 5
EXIT_INTERRUPTED = 130
EXIT_PIPE = 141

_NETWORK_NAMES = ("ConnectionError", "ConnectTimeout", "TimeoutError", "Timeout",
                  "ClientConnectorError", "ServerTimeoutError")


def _is_network(e: BaseException) -> bool:
    """Client libraries (botocore, aiohttp) raise their own trees, not always ``OSError``."""
    return isinstance(e, (ConnectionError, TimeoutError)) or any(
        cls.__name__.endswith(_NETWORK_NAMES) for cls in type(e).__mro__)


def exit_status(e: BaseException) -> int:
    """The exit status for an error that ended a command."""
    if isinstance(e, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(e, NotAStoreError) or (isinstance(e, RefError) and not isinstance(e, RefExists)):
        return EXIT_NOT_FOUND
    if isinstance(e, CorruptionError):
        return EXIT_CORRUPT
    if isinstance(e, OSError) or _is_network(e):
        return EXIT_STORAGE
    return EXIT_ERROR
