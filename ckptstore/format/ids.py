"""Commit ids: 20 random hex digits, then the creation time in milliseconds (12 hex digits).

The time lets gc age an orphan (data without a manifest, a crashed commit) on any back-end,
without file modification times.
"""

from __future__ import annotations

import re
import secrets
import time

__all__ = ["COMMIT_ID_RE", "commit_time", "is_commit_id", "new_commit_id"]

COMMIT_ID_RE = re.compile(r"^[0-9a-f]{32}$")


def new_commit_id(now: float | None = None) -> str:
    """32 hex digits: 20 random, then the creation time in ms (so gc knows an orphan's age)."""
    ms = int((time.time() if now is None else now) * 1000)
    return secrets.token_hex(10) + f"{ms:012x}"[-12:]


def commit_time(commit_id: str) -> float:
    """Creation time (seconds since the epoch) encoded in a commit id."""
    return int(commit_id[20:], 16) / 1000.0


def is_commit_id(text: str) -> bool:
    """True for a full commit id (32 lowercase hex digits)."""
    return bool(COMMIT_ID_RE.fullmatch(text))
