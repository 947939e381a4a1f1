"""Tiered stores: commits land on a local tier and are uploaded to the remote in the background.

``ckptstore.open("s3://bucket/run", local="/nvme/ckpts")`` gives a store of two tiers, each a
complete store of the same format: commits land on the local one (durable when they return),
an upload journal on it (:mod:`.journal`) lists the commits not yet on the remote, and one
thread (:mod:`.uploader`) copies them key for key (:mod:`.copy`: chunks, then manifest, then
ref, then tags), in commit order, each copy in an upload process where one runs
(:mod:`.offload`); branch and tag changes are replayed there in the same order
(:mod:`.refops`). Reads go local first (:mod:`.storage`); each tier has its
retention rule and gc, and neither deletes what a commit not uploaded yet needs
(:mod:`.retention`, applied by :mod:`.tiered`). Under a process group each rank has a local
tier of its own, uploads its part of a sharded commit and a completion object; the coordinator
publishes once every part is up (:mod:`.parts`). See docs/tiers.md.

May import: commit, maintenance, policy, history, format, storage and the top-level helpers
(errors, limits, info, priority, progress, _version).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .journal import Journal, Record
    from .offload import UploadProcessWarning
    from .refops import MirroredRefs
    from .storage import TieredStorage
    from .tiered import Tiers, UploadBudgetWarning, UploadWarning, pending_uploads
    from .uploader import Upload, Uploader

#: public name -> the module it lives in, imported on first use (an upload process imports
#: :mod:`.copy` without the rest, and without torch)
_LAZY = {"Journal": "journal", "Record": "journal", "UploadProcessWarning": "offload",
         "MirroredRefs": "refops", "TieredStorage": "storage", "Tiers": "tiered",
         "UploadBudgetWarning": "tiered", "UploadWarning": "tiered",
         "pending_uploads": "tiered", "Upload": "uploader", "Uploader": "uploader"}

__all__ = ["Journal", "MirroredRefs", "Record", "TieredStorage", "Tiers", "Upload",
           "UploadBudgetWarning", "UploadProcessWarning", "UploadWarning", "Uploader",
           "pending_uploads"]


_MODULES = {"copy", "journal", "landing", "offload", "parts", "refops", "retention", "storage",
            "tiered", "upload_worker", "uploader"}


def __getattr__(name: str) -> Any:
    """Import a public name, or a module of the package (``ckptstore.tiers.tiered``), on first
    use."""
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    elif name in _MODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
