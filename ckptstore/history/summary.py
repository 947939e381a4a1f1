"""What history walks read of a commit, without its entries.

A decoded manifest takes about 4 KB and a dozen Python objects for each of its entries; a
training process that caches hundreds of them keeps hundreds of MB alive and makes every full
garbage collection walk them. Log, revisions, reachability and retention (which runs after
every commit with ``keep=``) need only a commit's place in history and what it keeps alive:
a :class:`Summary`, a few hundred bytes, which the repository caches by the ten thousand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .manifest import Manifest

__all__ = ["Summary"]


@dataclass(frozen=True)
class Summary:
    """A commit's header and the commits it keeps alive (see :class:`Manifest`).

    Attributes
    ----------
    data_commits
        Commits whose ``data/`` its own entries point into (:meth:`Manifest.data_commits`).
    base_commits
        Commits whose entries its chain entries build on (:meth:`Manifest.base_commits`):
        their manifests are needed to rebuild it, and theirs transitively.
    tensors
        How many tensor entries it has.
    """

    id: str
    parent: str | None
    generation: int
    time: float
    message: str
    metadata: dict[str, Any]
    logical_bytes: int
    stored_bytes: int
    tensors: int
    data_commits: frozenset[str]
    base_commits: frozenset[str]

    @classmethod
    def of(cls, m: Manifest) -> Summary:
        return cls(id=m.id, parent=m.parent, generation=m.generation, time=m.time,
                   message=m.message, metadata=dict(m.metadata), logical_bytes=m.logical_bytes,
                   stored_bytes=m.stored_bytes, tensors=len(m.tensors),
                   data_commits=frozenset(m.data_commits()),
                   base_commits=frozenset(m.base_commits()))
