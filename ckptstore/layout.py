"""The one place that knows where things live inside a store (format v1).

::

    <root>/ckptstore.json             format marker and version, written once
    <root>/refs/heads/<branch>/<seq>  one immutable file per branch move (commit id); max seq = tip
    <root>/refs/tags/<name>           immutable tag file (commit id)
    <root>/commits/<id>.msgpack       immutable commit manifest
    <root>/data/<id>/                 zarr v3 group with the commit's arrays

All keys are relative to the store root and use ``/``.
"""

from __future__ import annotations

import re

from .errors import InvalidRefName

__all__ = [
    "COMMITS",
    "COMMIT_ID_RE",
    "DATA",
    "HEADS",
    "MARKER",
    "RESTORES",
    "SEQ_WIDTH",
    "TAGS",
    "branch_dir",
    "branch_seq",
    "check_ref_name",
    "data_dir",
    "is_commit_id",
    "manifest_key",
    "tag_key",
]

MARKER = "ckptstore.json"
COMMITS = "commits"
DATA = "data"
HEADS = "refs/heads"
TAGS = "refs/tags"
RESTORES = "stats/restores"  # one file per resume of training (restore budget)
SEQ_WIDTH = 12  # zero-padded so that lexical order is numeric order

COMMIT_ID_RE = re.compile(r"^[0-9a-f]{32}$")
# git-like names, one path component: no '/', no '..', no leading '.' or '-', no ref syntax chars.
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$")


def check_ref_name(name: str, what: str = "ref") -> str:
    """Return ``name`` if it is a valid branch/tag name, else raise :class:`InvalidRefName`."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or ".." in name or name.endswith(
        (".", ".lock")
    ):
        raise InvalidRefName(
            f"invalid {what} name {name!r}: use letters, digits, '.', '_' and '-' (no '/', '..', "
            "'~', '^', spaces; not starting with '.' or '-', not ending with '.' or '.lock')"
        )
    if is_commit_id(name):
        raise InvalidRefName(f"invalid {what} name {name!r}: it looks like a commit id")
    return name


def is_commit_id(text: str) -> bool:
    return bool(COMMIT_ID_RE.match(text))


def branch_dir(branch: str) -> str:
    return f"{HEADS}/{check_ref_name(branch, 'branch')}"


def branch_seq(branch: str, seq: int) -> str:
    return f"{branch_dir(branch)}/{seq:0{SEQ_WIDTH}d}"


def tag_key(name: str) -> str:
    return f"{TAGS}/{check_ref_name(name, 'tag')}"


def manifest_key(commit_id: str) -> str:
    return f"{COMMITS}/{commit_id}.msgpack"


def data_dir(commit_id: str) -> str:
    return f"{DATA}/{commit_id}"
