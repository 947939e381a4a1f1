"""How ``ckpt`` opens a store: never creating one, failing fast on remote endpoints, and without
importing torch (the verbs that need :class:`~ckptstore.Store` build it on this storage)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ..errors import NotAStoreError
from ..format.layout import MARKER
from ..history.manifest import decode_marker
from ..storage import Storage, open_storage
from ._context import CliError

__all__ = ["REMOTE_DEFAULTS", "open_existing", "with_cli_defaults"]

# S3 (s3fs/botocore): give up on an endpoint that does not answer within seconds. Before, a
# refused port took about 11 s (botocore's 5 backed-off attempts inside s3fs's 5, inside
# ckptstore's Retry) and a silent host far longer. Now: refused ~1 s, silent ~5 s (two connect
# timeouts). s3fs's own loop still retries throttling and dropped connections.
REMOTE_DEFAULTS: dict[str, dict[str, Any]] = {
    "s3": {"config_kwargs": {"connect_timeout": 2, "read_timeout": 30,
                             "retries": {"max_attempts": 1, "mode": "standard"}}},
}
REMOTE_DEFAULTS["s3a"] = REMOTE_DEFAULTS["s3"]
_RETRY_ATTEMPTS = 1  # ckptstore's own retry around each request (s3fs's loop is inside it)


def _protocol(url: str) -> str | None:
    from fsspec.core import split_protocol

    return split_protocol(url)[0]


def _merge(defaults: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    out = dict(defaults)
    for k, v in given.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def with_cli_defaults(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` over the CLI's timeouts for ``url``'s protocol (what the user gave wins).

    >>> with_cli_defaults("s3://b/p", {"config_kwargs": {"connect_timeout": 9}})["config_kwargs"]
    {'connect_timeout': 9, 'read_timeout': 30, 'retries': {'max_attempts': 1, 'mode': 'standard'}}
    >>> with_cli_defaults("./ckpts", {"x": 1})
    {'x': 1}
    """
    return _merge(REMOTE_DEFAULTS.get(_protocol(url) or "", {}), options)


def _check_protocol(url: str) -> None:
    import fsspec

    protocol = _protocol(url)
    if protocol and protocol not in fsspec.available_protocols():
        raise CliError(f"unknown storage protocol {protocol!r} in {url!r}: use a local path or "
                       "an fsspec URL such as s3://bucket/prefix, gs://..., memory://name")


def open_existing(url: str, options: dict[str, Any]) -> Storage:
    """The storage of the store at ``url``; :class:`NotAStoreError` if it holds none."""
    url = os.fspath(url)
    _check_protocol(url)
    try:
        storage = open_storage(url, **{"durable": True, **with_cli_defaults(url, options)})
    except ImportError as e:  # fsspec: "Install s3fs to access S3"
        raise CliError(f"cannot open {url}: {e}") from None
    retry = getattr(storage, "retry", None)
    if dataclasses.is_dataclass(retry) and getattr(retry, "attempts", 0) > _RETRY_ATTEMPTS:
        storage.retry = dataclasses.replace(retry, attempts=_RETRY_ATTEMPTS)
    try:
        decode_marker(storage.read(MARKER), storage.path(MARKER))
    except FileNotFoundError:
        raise NotAStoreError(f"no ckptstore at {url}: check the location (ckpt never creates a "
                             "store; ckptstore.open(url) in Python does)") from None
    return storage
