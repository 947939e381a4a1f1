"""What crosses between a store and its persist process (``open(..., background="process")``):
length-prefixed msgpack frames over a pipe, the store's configuration objects as plain data, and
errors by name. Nothing is pickled: the configuration classes are named in :data:`CONFIG_TYPES`,
anything else is refused with :class:`~ckptstore.errors.PersistProcessError`.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import struct
from typing import Any

import msgpack

from .. import errors
from ..errors import PersistProcessError

__all__ = ["CONFIG_TYPES", "config_type", "error_from_plain", "error_to_plain", "from_plain",
           "read_frame", "to_plain", "write_frame"]

#: the classes a persist process can be given (frozen dataclasses of plain fields), by name: the
#: module each lives in, imported when one is first met (a tiered store's upload process takes a
#: ``Retry`` and imports no policy, nor torch)
CONFIG_TYPES: dict[str, str] = {
    "EncodingOptions": "ckptstore.commit.plan", "Policy": "ckptstore.policy",
    "QuantSpec": "ckptstore.policy", "BitWidth": "ckptstore.policy.bitwidth",
    "Intermittent": "ckptstore.policy.rebase", "MaxChain": "ckptstore.policy.rebase",
    "Shrink": "ckptstore.policy.shrink", "Retry": "ckptstore.storage.retry",
    "LatestN": "ckptstore.policy.retention", "EveryN": "ckptstore.policy.retention",
    "BestN": "ckptstore.policy.retention", "AnyOf": "ckptstore.policy.retention"}


def config_type(name: object) -> type | None:
    """The class of :data:`CONFIG_TYPES` called ``name``, or None."""
    module = CONFIG_TYPES.get(name) if isinstance(name, str) else None
    return None if module is None else getattr(importlib.import_module(module), name)


_HEADER = struct.Struct("<Q")
#: the largest frame either side accepts (a state's tree and leaf table, not its bytes)
MAX_FRAME = 1 << 30


def write_frame(fd: int, message: object) -> None:
    """Send ``message`` (msgpack-able) as one frame on file descriptor ``fd``."""
    body = msgpack.packb(message, use_bin_type=True)
    if len(body) > MAX_FRAME:
        raise PersistProcessError(
            f"a {len(body)}-byte message for the persist process (a state's tree and plain "
            f"values take at most {MAX_FRAME}): keep large values in tensors, or use "
            "background='thread'")
    view = memoryview(_HEADER.pack(len(body)) + body)
    while view:
        view = view[os.write(fd, view):]


def read_frame(fd: int) -> Any:
    """The next frame's message on ``fd``; ``EOFError`` where the other side closed it."""
    (size,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size))
    if size > MAX_FRAME:
        raise PersistProcessError(f"a frame of {size} bytes from the persist pipe: the other "
                                  "side is not a ckptstore of this version")
    return msgpack.unpackb(_read_exactly(fd, size), raw=False, strict_map_key=False,
                           use_list=True)


def _read_exactly(fd: int, n: int) -> bytes:
    parts, left = [], n
    while left:
        part = os.read(fd, min(left, 1 << 24))
        if not part:
            raise EOFError("the persist pipe was closed")
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def to_plain(obj: object, where: str = "configuration") -> object:
    """``obj`` as plain data: scalars, tuples, dicts of str keys (storage options), and the
    dataclasses of :data:`CONFIG_TYPES`."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (tuple, list)):
        return {"tuple": [to_plain(x, where) for x in obj]}
    if isinstance(obj, dict) and all(isinstance(k, str) for k in obj):  # storage options
        return {"dict": {k: to_plain(v, where) for k, v in obj.items()}}
    name = type(obj).__name__
    if dataclasses.is_dataclass(obj) and name in CONFIG_TYPES and config_type(name) is type(obj):
        return {"type": name, "fields": {f.name: to_plain(getattr(obj, f.name), where)
                                         for f in dataclasses.fields(obj) if f.init}}
    raise PersistProcessError(
        f"the {where} holds a {name}, which cannot be sent to a persist process (it takes "
        f"{', '.join(sorted(CONFIG_TYPES))}, tuples, dicts and plain values): use "
        "background='thread' for it")


def from_plain(data: object) -> object:
    """The inverse of :func:`to_plain`."""
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, dict) and set(data) == {"tuple"} and isinstance(data["tuple"], list):
        return tuple(from_plain(x) for x in data["tuple"])
    if isinstance(data, dict) and set(data) == {"dict"} and isinstance(data["dict"], dict):
        return {str(k): from_plain(v) for k, v in data["dict"].items()}
    if isinstance(data, dict) and set(data) == {"type", "fields"}:
        cls = config_type(data["type"])
        if cls is not None and isinstance(data["fields"], dict):
            return cls(**{k: from_plain(v) for k, v in data["fields"].items()})
    raise PersistProcessError(f"not a configuration a persist process takes: {data!r:.200}")


#: the attributes of ckptstore's errors (and OSError's errno) that cross with them
_ERROR_ATTRIBUTES = ("commit_id", "branch", "key", "errno", "path")


def error_to_plain(error: BaseException) -> dict[str, object]:
    """An exception as ``{"type", "message", "attrs"}``: its class name, its text and the plain
    values of :data:`_ERROR_ATTRIBUTES` it has (``ConcurrentUpdateError.commit_id``, ...)."""
    attrs = {k: getattr(error, k) for k in _ERROR_ATTRIBUTES
             if isinstance(getattr(error, k, None), (str, int))}
    return {"type": type(error).__name__, "message": str(error), "attrs": attrs}


_BUILTIN_ERRORS: dict[str, type[BaseException]] = {c.__name__: c for c in (
    ValueError, TypeError, KeyError, OSError, MemoryError, RuntimeError, FileNotFoundError,
    PermissionError, InterruptedError, NotADirectoryError, IsADirectoryError, FileExistsError,
    BlockingIOError, BrokenPipeError, ChildProcessError, ConnectionError,
    ConnectionAbortedError, ConnectionRefusedError, ConnectionResetError, ProcessLookupError,
    TimeoutError)}


def error_from_plain(data: object, source: str = "persist process") -> BaseException:
    """The exception a helper process (``source``) reported: the ckptstore error (or common
    built-in) of that name with its message, else :class:`PersistProcessError` naming it."""
    if not isinstance(data, dict):
        return PersistProcessError(f"the {source} failed: {data!r:.200}")
    name, message = str(data.get("type")), str(data.get("message"))
    cls = getattr(errors, name, None) or _BUILTIN_ERRORS.get(name)
    if isinstance(cls, type) and issubclass(cls, BaseException) and name in (
            errors.__all__ + list(_BUILTIN_ERRORS)):
        try:
            error = cls(message)
        except TypeError:  # pragma: no cover - every listed class takes a message
            pass
        else:
            attrs = data.get("attrs")
            for k, v in (attrs.items() if isinstance(attrs, dict) else ()):
                if k in _ERROR_ATTRIBUTES and isinstance(v, (str, int)):
                    setattr(error, k, v)
            return error
    return PersistProcessError(f"the {source} failed: {name}: {message}")
