"""Tiered stores: commits land on a local tier and are uploaded to the remote in the background.

``ckptstore.open("s3://bucket/run", local="/nvme/ckpts")`` gives a store of two tiers, each a
complete store of the same format: commits land on the local one (durable when they return),
an upload journal on it (:mod:`.journal`) lists the commits not yet on the remote, and one
thread (:mod:`.uploader`) copies them key for key (:mod:`.copy`: chunks, then manifest, then
ref, then tags), in commit order; branch and tag changes are replayed there in the same order
(:mod:`.refops`). Reads go local first (:mod:`.storage`); each tier has its
retention rule and gc, and neither deletes what a commit not uploaded yet needs
(:mod:`.retention`, applied by :mod:`.tiered`). Under a process group each rank has a local
tier of its own, uploads its part of a sharded commit and a completion object; the coordinator
publishes once every part is up (:mod:`.parts`). See docs/tiers.md.

May import: commit, maintenance, policy, history, format, storage and the top-level helpers
(errors, limits, info, priority, progress, _version).
"""

from .journal import Journal, Record
from .refops import MirroredRefs
from .storage import TieredStorage
from .tiered import Tiers, UploadBudgetWarning, UploadWarning, pending_uploads
from .uploader import Upload, Uploader

__all__ = ["Journal", "MirroredRefs", "Record", "TieredStorage", "Tiers", "Upload",
           "UploadBudgetWarning", "UploadWarning", "Uploader", "pending_uploads"]
