"""Whole-array deduplication: a tensor whose bits equal the previous commit's is not written again.

With ``EncodingOptions(dedup=True)`` every full array entry records the sha256 of its bits
(``TensorEntry.digest``, manifest format 3). When a commit finds the same digest, dtype, shape,
chunk grid and codec on the same path of its parent commit, its entry points at the parent's
stored array (``commit`` names the commit that wrote it) and nothing is written: frozen layers, the
base model of a LoRA fine-tune and unchanged optimizer state cost a manifest entry. ``gc`` keeps a
data folder as long as any retained commit points into it, so shared arrays live as long as their
last user.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .manifest import Layout, Manifest, TensorEntry
from .plan import ArrayItem

__all__ = ["Dedup", "Reused", "content_digest"]


def content_digest(host: np.ndarray) -> str:
    """``"sha256:<hex>"`` of an array's bits in C order (hashlib releases the GIL)."""
    return "sha256:" + hashlib.sha256(memoryview(np.ascontiguousarray(host)).cast("B")
                                      ).hexdigest()


@dataclass(frozen=True)
class Reused:
    """Where the bits of a deduplicated entry already are."""

    commit: str
    array: str


@dataclass(frozen=True)
class Dedup:
    """The parent commit's full array entries by path (empty for a first commit)."""

    previous: Mapping[str, TensorEntry]

    @classmethod
    def against(cls, parent: Manifest | None) -> Dedup:
        """The full arrays of ``parent``: whole tensors, and the shards of sharded ones (by
        their ``<fqn>@<offsets>`` paths: a shard is compared with the same block)."""
        return cls({e.path: e for e in (*parent.tensors, *parent.shards)
                    if e.layout == Layout.ARRAY} if parent is not None else {})

    def find(self, p: ArrayItem, digest: str) -> Reused | None:
        """The parent's array holding exactly these bits, encoded the same way, if any."""
        e = self.previous.get(p.path)
        if (e is None or e.digest != digest or e.dtype != p.dtype or e.shape != list(p.shape)
                or e.chunks != list(p.grid.chunks) or e.codec != p.codec.config()):
            return None
        return Reused(e.commit, e.array)
