"""The one place that knows where things live inside a store (format v1).

::

    <root>/ckptstore.json             format marker and version, written once
    <root>/refs/heads/<branch>/<seq>  one immutable file per branch move (commit id); max seq = tip
    <root>/refs/tags/<name>           immutable tag file (commit id)
    <root>/commits/<id>.msgpack       immutable commit manifest
    <root>/data/<id>/                 zarr v3 group with the commit's arrays
    <root>/data/<id>/<array>/         one zarr v3 array: zarr.json and its chunks
    <root>/data/<id>/_packed/         the small tensors of a commit, back to back
    <root>/stats/restores/<id>        one file per resume of training (restore budget)

All keys are relative to the store root and use ``/``.
"""

from __future__ import annotations

import re

from ..errors import InvalidRefName, ManifestError
from ..storage.base import TEMP_PREFIX  # temporary files of local writes; gc removes them
from .ids import COMMIT_ID_RE, is_commit_id

__all__ = [
    "COMMITS",
    "COMMIT_ID_RE",
    "DATA",
    "HEADS",
    "MARKER",
    "PACKED_ARRAY",
    "RESTORES",
    "SEQ_WIDTH",
    "TAGS",
    "TEMP_PREFIX",
    "ZARR_JSON",
    "array_dir",
    "branch_dir",
    "branch_seq",
    "chunk_key",
    "check_ref_name",
    "data_dir",
    "is_array_name",
    "is_commit_id",
    "manifest_id",
    "manifest_key",
    "part_array",
    "restore_key",
    "tag_key",
]

MARKER = "ckptstore.json"
COMMITS = "commits"
DATA = "data"
HEADS = "refs/heads"
TAGS = "refs/tags"
RESTORES = "stats/restores"  # one file per resume of training (restore budget)
SEQ_WIDTH = 12  # zero-padded so that lexical order is numeric order
PACKED_ARRAY = "_packed"  # the array of a commit that holds its small tensors
ZARR_JSON = "zarr.json"  # zarr v3 metadata document of a group or an array
_MANIFEST_SUFFIX = ".msgpack"

# git-like names, one path component: no '/', no '..', no leading '.' or '-', no ref syntax chars.
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$")
# every array name a writer makes (plan._array_name, chain parts, packed arrays): one path
# component, the same on every filesystem -- no '/', '\\', ':', NUL, control characters, '..'
_ARRAY_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._~-]{0,254}")


def is_array_name(name: object) -> bool:
    """Whether ``name`` may name an array folder under ``data/<id>/`` (a manifest is untrusted:
    anything else could reach outside it, e.g. through ``\\`` on a Windows disk)."""
    return isinstance(name, str) and bool(_ARRAY_NAME_RE.fullmatch(name)) and not name.startswith(
        "__")


def check_ref_name(name: str, what: str = "ref") -> str:
    """Return ``name`` if it is a valid branch/tag name, else raise :class:`InvalidRefName`."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or ".." in name or name.endswith(
        (".", ".lock")
    ):
        raise InvalidRefName(
            f"invalid {what} name {name!r}: use letters, digits, '.', '_' and '-' (no '/', '..', "
            "'~', '^', spaces; not starting with '.' or '-', not ending with '.' or '.lock')"
        )
    if is_commit_id(name):
        raise InvalidRefName(f"invalid {what} name {name!r}: it looks like a commit id")
    return name


def branch_dir(branch: str) -> str:
    return f"{HEADS}/{check_ref_name(branch, 'branch')}"


def branch_seq(branch: str, seq: int) -> str:
    return f"{branch_dir(branch)}/{seq:0{SEQ_WIDTH}d}"


def tag_key(name: str) -> str:
    return f"{TAGS}/{check_ref_name(name, 'tag')}"


def manifest_key(commit_id: str) -> str:
    return f"{COMMITS}/{commit_id}{_MANIFEST_SUFFIX}"


def manifest_id(name: str) -> str | None:
    """The commit id of a file name listed under ``commits/``, or None for anything else."""
    if name.endswith(_MANIFEST_SUFFIX) and COMMIT_ID_RE.fullmatch(name[: -len(_MANIFEST_SUFFIX)]):
        return name[: -len(_MANIFEST_SUFFIX)]
    return None


def data_dir(commit_id: str) -> str:
    return f"{DATA}/{commit_id}"


def array_dir(commit_id: str, array: str) -> str:
    """Folder of one zarr array of a commit (its ``zarr.json`` and chunks); a name no writer
    makes is a :class:`ManifestError`."""
    if not isinstance(commit_id, str) or not COMMIT_ID_RE.fullmatch(commit_id) or (
            not is_array_name(array)):
        raise ManifestError(f"array {array!r} of commit {commit_id!r} is not a name ckptstore "
                            "writes: the manifest is damaged or hostile")
    return f"{DATA}/{commit_id}/{array}"


def chunk_key(array_prefix: str, grid_key: str) -> str:
    """Store key of one chunk of the array at ``array_prefix`` (``grid_key`` like ``c/0/0``)."""
    return f"{array_prefix}/{grid_key}"


def part_array(array: str, part: str) -> str:
    """Name of a chain entry's part array: ``<array>.rows``, ``.values`` or ``.codes``."""
    return f"{array}.{part}"


def restore_key(record_id: str) -> str:
    return f"{RESTORES}/{record_id}"
