"""Single-file sources: a safetensors file and a ``torch.save`` file (weights only)."""

from __future__ import annotations

import os
from typing import Any

import torch

from .source import ImportSourceError, load_torch, open_regular

__all__ = ["read_safetensors", "read_tensor_file", "read_torch_file"]


def read_safetensors(file: str | os.PathLike[str]
                     ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``(tensors, __metadata__)`` of a safetensors file.

    Raises
    ------
    ImportSourceError
        Not a regular file, or a header or data safetensors refuses.
    """
    from safetensors import safe_open

    path = os.fspath(file)
    open_regular(path, "safetensors file").close()  # a FIFO or device would hang the reader
    try:
        with safe_open(path, framework="pt") as f:
            return ({k: f.get_tensor(k) for k in f.keys()},  # noqa: SIM118
                    dict(f.metadata() or {}))
    except Exception as e:  # SafetensorError (a bad header), OSError, ...: untrusted bytes
        text = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ImportSourceError(f"{path} is not a readable safetensors file "
                                f"({type(e).__name__}: {text[:200]})") from None


def read_torch_file(file: str | os.PathLike[str]) -> Any:
    """The object of a ``torch.save`` file, loaded with ``weights_only=True`` only."""
    path = os.fspath(file)
    with open_regular(path, "torch.save file") as f:
        return load_torch(f, path)


def read_tensor_file(file: str) -> dict[str, torch.Tensor]:
    """A ``torch.save`` file that must hold a mapping of names to tensors (a weights shard)."""
    value = read_torch_file(file)
    if not (isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                            for k, v in value.items())):
        raise ImportSourceError(f"{file} is not a mapping of names to tensors (a weights file)")
    return value
