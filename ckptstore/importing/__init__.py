"""Commit checkpoints written by other tools: safetensors, ``torch.save``, Hugging Face model
directories and ``torch.distributed.checkpoint`` (DCP) directories. Nothing is unpickled freely.

- **safetensors** file: its tensors (under ``model`` by default); its ``__metadata__`` goes into
  the commit's metadata as ``safetensors.<key>``.
- **torch.save** file: read only with ``torch.load(weights_only=True)``: tensors, plain values,
  dicts, lists, tuples. A file that needs pickle (custom classes) is refused.
- **Hugging Face** model directory: ``config.json`` (as the ``config`` entry) and the weights of
  ``model.safetensors`` (sharded or not) or ``pytorch_model.bin`` (``weights_only=True``), under
  ``model`` -- the layout :func:`ckptstore.hf.export_pretrained` writes back.
- **DCP** directory (``FileSystemWriter`` output): read in one process, tensors at their global
  shape. DCP's ``.metadata`` file is a pickle of its own metadata dataclasses; it is read by an
  unpickler that resolves only those classes (``torch.distributed.checkpoint.metadata`` and the
  storage-info records of ``filesystem``), ``pathlib`` paths, ``torch.Size`` and torch dtypes,
  layouts (by name) and memory formats, and refuses every other global -- so no function can
  run. Tensors are read with
  ``torch.load(weights_only=True)`` as DCP itself does; non-tensor values too (DCP's default
  planner would use ``weights_only=False``).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from .errors import CkptStoreError
from .info import CommitInfo
from .policy import Policy
from .store import Store

__all__ = ["FORMATS", "ImportSourceError", "detect_format", "import_checkpoint", "read_dcp",
           "read_hf_directory", "read_safetensors", "read_source", "read_torch_file"]

FORMATS = ("safetensors", "torch", "hf", "dcp")


class ImportSourceError(CkptStoreError, ValueError):
    """A source that cannot be imported: unknown format, missing files, or a file that would
    need pickle to load."""


def detect_format(source: str | os.PathLike[str]) -> str:
    """``"safetensors"``, ``"torch"``, ``"hf"`` or ``"dcp"`` from what ``source`` holds."""
    source = os.fspath(source)
    if os.path.isdir(source):
        if os.path.isfile(os.path.join(source, ".metadata")):
            return "dcp"
        if os.path.isfile(os.path.join(source, "config.json")):
            return "hf"
        raise ImportSourceError(f"{source} is a folder with neither .metadata (a DCP checkpoint) "
                                "nor config.json (a Hugging Face model)")
    if not os.path.isfile(source):
        raise ImportSourceError(f"{source} does not exist")
    with open(source, "rb") as f:
        head = f.read(9)
    if head[:4] == b"PK\x03\x04" or head[:1] == b"\x80":
        return "torch"  # torch.save's zip format, or its legacy pickle format
    if len(head) == 9 and head[8:9] == b"{":
        return "safetensors"
    raise ImportSourceError(f"{source}: not a safetensors or torch.save file; pass the format "
                            f"(one of {', '.join(FORMATS)})")


# -- safetensors and torch.save ----------------------------------------------------------------
def read_safetensors(file: str | os.PathLike[str]
                     ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``(tensors, __metadata__)`` of a safetensors file."""
    from safetensors import safe_open
    with safe_open(os.fspath(file), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})  # noqa: SIM118


def read_torch_file(file: str | os.PathLike[str]) -> Any:
    """The object of a ``torch.save`` file, loaded with ``weights_only=True`` only."""
    try:
        return torch.load(os.fspath(file), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ImportSourceError(
            f"{os.fspath(file)} needs pickle to load (torch.load(weights_only=True) refused it: "
            f"{first}); ckptstore never unpickles. Re-save it from trusted code as tensors and "
            "plain values (e.g. torch.save(model.state_dict(), ...)) or as safetensors") from None


# -- Hugging Face model directories ----------------------------------------------------------
def read_hf_directory(directory: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], str]:
    """``(weights, config.json text)`` of a Hugging Face model directory."""
    directory = os.fspath(directory)
    with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
        config = f.read()
    names = os.listdir(directory)
    for index, single, reader in (
            ("model.safetensors.index.json", "model.safetensors", lambda p: read_safetensors(p)[0]),
            ("pytorch_model.bin.index.json", "pytorch_model.bin", read_torch_file)):
        if index in names:
            with open(os.path.join(directory, index), encoding="utf-8") as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        elif single in names:
            files = [single]
        else:
            continue
        weights: dict[str, torch.Tensor] = {}
        for name in files:
            weights.update(reader(os.path.join(directory, name)))
        return weights, config
    raise ImportSourceError(f"{directory} has config.json but no model.safetensors, "
                            "pytorch_model.bin or their .index.json")


# -- DCP ---------------------------------------------------------------------------------------
_DCP_CLASSES = {
    ("torch.distributed.checkpoint.metadata", n) for n in (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")
} | {("torch.distributed.checkpoint.filesystem", n) for n in ("_StorageInfo", "_StoragePrefix")} | {
    ("torch", "Size"), ("collections", "OrderedDict")} | {
    (m, n) for m in ("pathlib", "pathlib._local")  # storage_meta.checkpoint_id
    for n in ("Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")}


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
    """DCP's ``Metadata`` of a checkpoint directory, read by the restricted unpickler."""
    path = os.path.join(os.fspath(directory), ".metadata")
    with open(path, "rb") as f:
        try:
            return _MetadataUnpickler(f).load()
        except (pickle.UnpicklingError, EOFError, AttributeError, TypeError) as e:
            raise ImportSourceError(f"{path}: not a readable DCP metadata file ({e})") from None


def _nest(flat: dict[str, Any], mapping: dict[str, Sequence[Any]] | None) -> dict[str, Any]:
    """Undo DCP's flattening of nested dicts and lists (``planner_data``: fqn -> key path)."""
    root: dict[Any, Any] = {}
    for fqn, value in flat.items():
        path = list(mapping.get(fqn, (fqn,))) if mapping else [fqn]
        node = root
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value

    def lists(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        out = {k: lists(v) for k, v in node.items()}
        if out and all(isinstance(k, int) for k in out) and sorted(out) == list(range(len(out))):
            return [out[i] for i in range(len(out))]
        return out

    return lists(root)


def read_dcp(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The state of a DCP checkpoint directory, read in this process (no process group)."""
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.metadata import StorageMeta, TensorStorageMetadata

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            metadata = read_dcp_metadata(self.path)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            fqn = read_item.dest_index.fqn
            self.original_state_dict[fqn] = torch.load(value, weights_only=True)

    directory = os.fspath(directory)
    metadata = read_dcp_metadata(directory)
    flat: dict[str, Any] = {}
    for fqn, md in metadata.state_dict_metadata.items():
        flat[fqn] = (torch.empty(md.size, dtype=md.properties.dtype)
                     if isinstance(md, TensorStorageMetadata) else None)
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.filterwarnings("ignore", ".*single process", UserWarning)
            dcp_load(flat, storage_reader=SafeReader(directory),
                     planner=SafePlanner(flatten_state_dict=False), no_dist=True)
    except pickle.UnpicklingError as e:
        raise ImportSourceError(f"{directory}: a value needs pickle to load ({e}); "
                                "ckptstore never unpickles") from None
    mapping = metadata.planner_data if isinstance(metadata.planner_data, dict) else None
    return _nest(flat, mapping)


# -- one call ----------------------------------------------------------------------------------
def read_source(source: str | os.PathLike[str], format: str = "auto",
                under: str | None = None) -> tuple[Any, dict[str, Any], str]:
    """``(state, metadata, format)`` of ``source``. ``under`` nests the tensors of a
    safetensors file or model directory under that key (default ``"model"``; ``""``: at the
    root); a torch.save file or DCP checkpoint is committed as it is unless ``under`` is given."""
    fmt = detect_format(source) if format == "auto" else format
    if fmt not in FORMATS:
        raise ImportSourceError(f"unknown format {format!r}: one of auto, {', '.join(FORMATS)}")
    source = os.fspath(source)
    metadata: dict[str, Any] = {"import.source": os.path.abspath(source), "import.format": fmt}
    if fmt == "safetensors":
        state, header = read_safetensors(source)
        metadata.update({f"safetensors.{k}": v for k, v in header.items()})
        key = "model" if under is None else under
    elif fmt == "hf":
        weights, config = read_hf_directory(source)
        key = "model" if under is None else under
        if not key:
            raise ImportSourceError("a model directory is committed as model weights + config: "
                                    "under cannot be empty")
        return {key: weights, "config": config}, metadata, fmt
    elif fmt == "torch":
        state, key = read_torch_file(source), under or ""
    else:
        state, key = read_dcp(source), under or ""
    return ({key: state} if key else state), metadata, fmt


def import_checkpoint(store: Store, source: str | os.PathLike[str], format: str = "auto",
                      under: str | None = None, message: str = "", branch: str = "main",
                      tags: Sequence[str] = (), policy: Policy | None = None) -> CommitInfo:
    """Commit the checkpoint at ``source`` (see the module docstring for the formats).

    Raises
    ------
    ImportSourceError
        Unknown or unreadable source, or one that would need pickle.
    UnsupportedLeafError
        A value (loaded without pickle) that ckptstore cannot store, e.g. a ``torch.dtype``.
    """
    state, metadata, fmt = read_source(source, format, under)
    return store.commit(state, message=message or f"import {fmt} {os.fspath(source)}",
                        branch=branch, tags=tags, metadata=metadata, policy=policy)
