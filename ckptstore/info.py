"""Plain result objects the store returns: commit info, gc summary, verify report."""

from __future__ import annotations

import datetime as _dt
from dataclasses import asdict, dataclass, field
from typing import Any

from .history.manifest import Manifest
from .history.summary import Summary

__all__ = ["CommitInfo", "GCResult", "VerifyReport"]


@dataclass(frozen=True)
class CommitInfo:
    """What one commit is: identity, ancestry, message and sizes."""

    id: str
    parent: str | None
    time: _dt.datetime
    message: str
    metadata: dict[str, Any]
    logical_bytes: int
    stored_bytes: int
    tensors: int

    @property
    def short_id(self) -> str:
        return self.id[:10]

    @property
    def step(self) -> Any:
        return self.metadata.get("step")

    @classmethod
    def from_manifest(cls, m: Manifest) -> CommitInfo:
        return cls.from_summary(Summary.of(m))

    @classmethod
    def from_summary(cls, s: Summary) -> CommitInfo:
        """From a commit's :class:`~ckptstore.history.summary.Summary` (what history walks
        cache)."""
        return cls(id=s.id, parent=s.parent,
                   time=_dt.datetime.fromtimestamp(s.time, tz=_dt.timezone.utc),
                   message=s.message, metadata=dict(s.metadata), logical_bytes=s.logical_bytes,
                   stored_bytes=s.stored_bytes, tensors=s.tensors)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["time"] = self.time.isoformat()
        return d

    @classmethod
    def from_json(cls, d: object) -> CommitInfo:
        """The inverse of :meth:`to_json`; ``TypeError``/``ValueError`` for anything else."""
        if not isinstance(d, dict):
            raise TypeError(f"a commit's info is a dict, not {type(d).__name__}")
        return cls(**{**d, "time": _dt.datetime.fromisoformat(d["time"])})


@dataclass
class GCResult:
    """What ``Store.gc`` removed (or would remove, with ``dry_run``)."""

    commits_removed: list[str] = field(default_factory=list)
    data_removed: list[str] = field(default_factory=list)
    tags_removed: list[str] = field(default_factory=list)
    ref_files_removed: int = 0
    bytes_freed: int = 0
    kept: list[str] = field(default_factory=list)
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class VerifyReport:
    """Problems ``Store.verify`` found: each names a path inside the store. ``dangling``: commits
    past a branch tip that no ref names (a lost ref file, or a commit stopped before its ref
    moved; :mod:`ckptstore.maintenance.dangling`), each with what to do -- reported, like git fsck's,
    without making the report not ``ok``."""

    commits_checked: int = 0
    chunks_checked: int = 0
    bytes_checked: int = 0
    problems: list[str] = field(default_factory=list)
    dangling: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d
