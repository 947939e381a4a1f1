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
  shape, by ckptstore's own reader (:mod:`.dcp_dir`): DCP's pickled ``.metadata`` through an
  unpickler that resolves only DCP's metadata records (no function can run), every chunk checked
  to tile its tensor exactly, and tensors and plain values read with
  ``torch.load(weights_only=True)`` (DCP's default planner would use ``weights_only=False``).

Every source is untrusted input: a file it names (an index's ``weight_map``, DCP's
``relative_path``) must stay inside the source folder, symlinks resolved; only regular files are
read; nothing is allocated beyond what the source holds; every refusal is one
:class:`ImportSourceError` line and commits nothing.

May import: the store facade (``ckptstore.store``) and everything below it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..info import CommitInfo
from ..policy import Policy
from ..store import Store
from .dcp_dir import read_dcp
from .dcp_metadata import read_dcp_metadata
from .files import read_safetensors, read_torch_file
from .hf_dir import read_hf_directory
from .source import ImportSourceError, open_regular

__all__ = ["FORMATS", "ImportSourceError", "detect_format", "import_checkpoint", "read_dcp",
           "read_dcp_metadata", "read_hf_directory", "read_safetensors", "read_source",
           "read_torch_file"]

FORMATS = ("safetensors", "torch", "hf", "dcp")


def detect_format(source: str | os.PathLike[str]) -> str:
    """``"safetensors"``, ``"torch"``, ``"hf"`` or ``"dcp"`` from what ``source`` holds."""
    source = os.fspath(source)
    if "\0" in source:
        raise ImportSourceError(f"{source!r}: a path with a NUL byte names no file")
    if os.path.isdir(source):
        if os.path.isfile(os.path.join(source, ".metadata")):
            return "dcp"
        if os.path.isfile(os.path.join(source, "config.json")):
            return "hf"
        raise ImportSourceError(f"{source} is a folder with neither .metadata (a DCP checkpoint) "
                                "nor config.json (a Hugging Face model)")
    if not os.path.isfile(source):
        raise ImportSourceError(f"{source} does not exist or is not a regular file")
    with open_regular(source, "import source") as f:
        head = f.read(9)
    if len(head) == 9 and head[8:9] == b"{":  # first: a header length may start with 0x80
        return "safetensors"
    if head[:4] == b"PK\x03\x04" or head[:1] == b"\x80":
        return "torch"  # torch.save's zip format, or its legacy pickle format
    raise ImportSourceError(f"{source}: not a safetensors or torch.save file; pass the format "
                            f"(one of {', '.join(FORMATS)})")


# -- one call ----------------------------------------------------------------------------------
def read_source(source: str | os.PathLike[str], format: str = "auto",
                under: str | None = None) -> tuple[Any, dict[str, Any], str]:
    """``(state, metadata, format)`` of ``source``, read as untrusted input. ``under`` nests the
    tensors of a safetensors file or model directory under that key (default ``"model"``; ``""``:
    at the root); a torch.save file or DCP checkpoint is committed as it is unless ``under`` is
    given (a torch.save file that holds no mapping needs it)."""
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
        if not key and not isinstance(state, dict):
            raise ImportSourceError(f"{source} holds a {type(state).__name__}, not a mapping: "
                                    "pass under= (ckpt import --under KEY) to nest it")
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
        Unknown, unreadable, malformed or crafted source (a chunk layout that does not tile
        its tensor, a path leaving the folder, ...), or one that would need pickle.
    UnsupportedLeafError
        A value (loaded without pickle) that ckptstore cannot store, e.g. a ``torch.dtype``.
    """
    state, metadata, fmt = read_source(source, format, under)
    return store.commit(state, message=message or f"import {fmt} {os.fspath(source)}",
                        branch=branch, tags=tags, metadata=metadata, policy=policy)
