"""DCP's ``.metadata`` read as untrusted input: a restricted unpickler, then every field checked
and turned into plain records (:class:`DcpTensor`, :class:`DcpBytes`) the reader trusts.

The file is a pickle of DCP's metadata dataclasses. The unpickler resolves only those classes
(``torch.distributed.checkpoint.metadata`` and the storage-info records of ``filesystem``),
``pathlib`` paths, ``torch.Size`` and torch dtypes, layouts (by name) and memory formats, and
refuses every other global -- so no function can run. The whole file is read first, so a length
in it can never make the unpickler ask for more bytes than the file has.
"""

from __future__ import annotations

import io
import os
import pickle
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .source import ImportSourceError, inside, open_regular

__all__ = ["MAX_DEPTH", "MAX_DIMS", "DcpBytes", "DcpLayout", "DcpTensor", "Storage",
           "read_dcp_layout", "read_dcp_metadata"]

MAX_DIMS = 64  # tensor dimensions (torch allows 64 at most)
MAX_DEPTH = 64  # nesting of planner_data key paths
_MAX_EXTENT = 1 << 62

_DCP_CLASSES = {
    ("torch.distributed.checkpoint.metadata", n) for n in (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")
} | {("torch.distributed.checkpoint.filesystem", n) for n in ("_StorageInfo", "_StoragePrefix")} | {
    ("torch", "Size"), ("collections", "OrderedDict")} | {
    (m, n) for m in ("pathlib", "pathlib._local")  # storage_meta.checkpoint_id
    for n in ("Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")}


@dataclass(frozen=True)
class Storage:
    """Where one item's bytes are: a file of the folder (relative name), offset, length."""

    file: str
    offset: int
    length: int


@dataclass(frozen=True)
class DcpTensor:
    """A tensor item: global ``size``, ``dtype``, its chunks (``offsets``, ``sizes``: int64
    arrays of shape (chunks, dims)) and each chunk's storage."""

    fqn: str
    size: tuple[int, ...]
    dtype: torch.dtype
    offsets: np.ndarray
    sizes: np.ndarray
    storage: tuple[Storage, ...]


@dataclass(frozen=True)
class DcpBytes:
    """A byte item (a ``torch.save``'d plain value) and its storage."""

    fqn: str
    storage: Storage


@dataclass(frozen=True)
class DcpLayout:
    """What a DCP folder holds, checked: its items and ``planner_data`` (fqn -> key path)."""

    items: tuple[DcpTensor | DcpBytes, ...]
    key_paths: dict[str, tuple[str | int, ...]]


def _layout(name: str) -> torch.layout:
    value = getattr(torch, name.rpartition(".")[2], None) if name.startswith("torch.") else None
    if not isinstance(value, torch.layout):
        raise ImportSourceError(f"DCP metadata names an unknown tensor layout {name!r}")
    return value


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves DCP's metadata records and torch constants, nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _DCP_CLASSES:
            return super().find_class(module, name)
        if (module, name) == ("torch.serialization", "_get_layout"):
            return _layout  # how torch pickles a layout: by its name
        if module == "torch" and isinstance(getattr(torch, name, None),
                                            (torch.dtype, torch.layout, torch.memory_format)):
            return getattr(torch, name)
        raise ImportSourceError(f"DCP metadata refers to {module}.{name}, which is not one of "
                                "DCP's metadata records: refusing to unpickle it")


def read_dcp_metadata(directory: str | os.PathLike[str]) -> Any:
    """DCP's ``Metadata`` object of a checkpoint directory, read by the restricted unpickler
    (its fields unchecked: :func:`read_dcp_layout` checks them)."""
    path = inside(os.fspath(directory), ".metadata", "DCP metadata")
    with open_regular(path, "DCP metadata") as f:
        data = f.read()
    try:
        return _MetadataUnpickler(io.BytesIO(data)).load()
    except ImportSourceError:
        raise
    except Exception as e:  # UnpicklingError, ValueError (protocol), MemoryError, RecursionError..
        text = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise ImportSourceError(f"{path}: not a readable DCP metadata file "
                                f"({type(e).__name__}: {text})") from None


def _dims(value: object, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or len(value) > MAX_DIMS or not all(
            type(v) is int and 0 <= v < _MAX_EXTENT for v in value):
        raise ImportSourceError(f"DCP metadata: {what} is {value!r}, not a list of at most "
                                f"{MAX_DIMS} non-negative extents")
    return tuple(value)


def _storage_index(storage_data: object) -> dict[tuple[str, tuple[int, ...] | None], Storage]:
    """``storage_data`` as ``{(fqn, chunk offsets or None): Storage}``."""
    if not isinstance(storage_data, dict):
        raise ImportSourceError("DCP metadata: storage_data is not a mapping")
    out: dict[tuple[str, tuple[int, ...] | None], Storage] = {}
    for key, info in storage_data.items():
        fqn, offset = getattr(key, "fqn", None), getattr(key, "offset", None)
        if not isinstance(fqn, str):
            raise ImportSourceError(f"DCP metadata: storage key {key!r} names no item")
        where = None if offset is None else _dims(offset, f"the storage offset of {fqn!r}")
        if getattr(info, "transform_descriptors", None):
            raise ImportSourceError(f"DCP item {fqn!r} is stored through DCP extensions "
                                    f"{info.transform_descriptors!r}, which ckptstore does not "
                                    "read; save it without extensions")
        file = getattr(info, "relative_path", None)
        offset_, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not (isinstance(file, str) and type(offset_) is int and type(length) is int
                and 0 <= offset_ < _MAX_EXTENT and 0 <= length < _MAX_EXTENT):
            raise ImportSourceError(f"DCP metadata: the storage of {fqn!r} is not a file name, "
                                    "offset and length")
        out[(fqn, where)] = Storage(file, offset_, length)
    return out


def _key_paths(planner_data: object) -> dict[str, tuple[str | int, ...]]:
    if planner_data is None:
        return {}
    if not isinstance(planner_data, dict):
        raise ImportSourceError("DCP metadata: planner_data is not a mapping")
    out: dict[str, tuple[str | int, ...]] = {}
    for fqn, path in planner_data.items():
        if not (isinstance(fqn, str) and isinstance(path, (tuple, list)) and path
                and all(isinstance(k, (str, int)) and type(k) is not bool for k in path)):
            raise ImportSourceError(f"DCP metadata: planner_data[{fqn!r}] is not a key path")
        if len(path) > MAX_DEPTH:
            raise ImportSourceError(f"DCP metadata: {fqn!r} is nested {len(path)} levels deep "
                                    f"(at most {MAX_DEPTH} are read)")
        out[fqn] = tuple(path)
    return out


def _tensor(fqn: str, md: Any, storage: dict) -> DcpTensor:
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorProperties

    properties, chunks = getattr(md, "properties", None), getattr(md, "chunks", None)
    dtype = getattr(properties, "dtype", None)
    if not (isinstance(properties, TensorProperties) and isinstance(dtype, torch.dtype)):
        raise ImportSourceError(f"DCP metadata: {fqn!r} has no tensor dtype")
    size = _dims(getattr(md, "size", None), f"the size of {fqn!r}")
    if not isinstance(chunks, list) or not all(isinstance(c, ChunkStorageMetadata)
                                               for c in chunks):
        raise ImportSourceError(f"DCP metadata: the chunks of {fqn!r} are not a list of chunks")
    offsets = [_dims(getattr(c, "offsets", None), f"a chunk offset of {fqn!r}") for c in chunks]
    sizes = [_dims(getattr(c, "sizes", None), f"a chunk size of {fqn!r}") for c in chunks]
    if any(len(o) != len(size) or len(s) != len(size) for o, s in zip(offsets, sizes)):
        raise ImportSourceError(f"DCP metadata: a chunk of {fqn!r} has not {len(size)} dims")
    missing = [o for o in offsets if (fqn, o) not in storage]
    if missing:
        raise ImportSourceError(f"DCP metadata: the chunk of {fqn!r} at {list(missing[0])} has "
                                "no storage entry")
    shape = (len(chunks), len(size))
    return DcpTensor(fqn, size, dtype, np.array(offsets, np.int64).reshape(shape),
                     np.array(sizes, np.int64).reshape(shape),
                     tuple(storage[(fqn, o)] for o in offsets))


def read_dcp_layout(directory: str | os.PathLike[str]) -> DcpLayout:
    """The checked items of a DCP folder's ``.metadata``.

    Raises
    ------
    ImportSourceError
        Not DCP's Metadata, or a field of it malformed (see the messages).
    """
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        Metadata,
        TensorStorageMetadata,
    )

    metadata = read_dcp_metadata(directory)
    if not isinstance(metadata, Metadata):
        raise ImportSourceError(f"{os.path.join(os.fspath(directory), '.metadata')} holds a "
                                f"{type(metadata).__name__}, not DCP's Metadata")
    entries = metadata.state_dict_metadata
    if not isinstance(entries, dict) or not all(isinstance(k, str) for k in entries):
        raise ImportSourceError("DCP metadata: state_dict_metadata is not a mapping of names")
    storage = _storage_index(metadata.storage_data)
    items: list[DcpTensor | DcpBytes] = []
    for fqn, md in entries.items():
        if isinstance(md, TensorStorageMetadata):
            items.append(_tensor(fqn, md, storage))
        elif isinstance(md, BytesStorageMetadata):
            if (fqn, None) not in storage:
                raise ImportSourceError(f"DCP metadata: {fqn!r} has no storage entry")
            items.append(DcpBytes(fqn, storage[(fqn, None)]))
        else:
            raise ImportSourceError(f"DCP metadata: {fqn!r} is a {type(md).__name__}, neither "
                                    "a tensor nor a bytes item")
    return DcpLayout(tuple(items), _key_paths(getattr(metadata, "planner_data", None)))
