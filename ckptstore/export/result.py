"""What an export wrote, and the error it raises for a bad target or selection."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..errors import ExportError

__all__ = ["ExportError", "ExportResult", "target_path"]


@dataclass(frozen=True)
class ExportResult:
    """One exported file: its path and size, the commit, the tensors and metadata keys written,
    and the entries left out (each ``"path (why)"``)."""

    file: str
    commit: str
    tensors: int
    nbytes: int
    metadata_keys: tuple[str, ...]
    skipped: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """A plain dict (``ckpt export --json``)."""
        return {"file": self.file, "id": self.commit, "tensors": self.tensors,
                "bytes": self.nbytes, "metadata_keys": list(self.metadata_keys),
                "skipped": list(self.skipped)}


def target_path(path: str | os.PathLike[str]) -> str:
    """``path`` as a string, refused (:class:`ExportError`) if no file could have that name."""
    path = os.fspath(path)
    if "\0" in path:
        raise ExportError(f"cannot write {path!r}: the path holds a NUL byte; choose another")
    return path
