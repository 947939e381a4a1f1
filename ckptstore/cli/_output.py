"""How ``ckpt`` prints: human sizes, times, aligned tables, and plain JSON for ``--json``."""

from __future__ import annotations

import datetime as _dt
import hashlib
import math
from collections.abc import Sequence
from typing import Any

__all__ = ["human_size", "jsonable", "one_line", "plural", "shape_text", "short_value", "table",
           "utc_time"]


def human_size(n: int | None) -> str:
    """``1536`` -> ``"1.5 KiB"``; bytes below 1 KiB are exact (``"512 B"``); None -> ``"-"``.

    >>> human_size(512), human_size(1536), human_size(3 * 2**30)
    ('512 B', '1.5 KiB', '3.0 GiB')
    """
    if n is None:
        return "-"
    if abs(n) < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if abs(value) < 1024 or unit == "PiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def plural(count: int, noun: str) -> str:
    """``plural(1, "commit")`` -> ``"1 commit"``, ``plural(2, "commit")`` -> ``"2 commits"``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def utc_time(t: _dt.datetime) -> str:
    """``2026-11-22 01:59:09`` (UTC)."""
    return t.astimezone(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def shape_text(shape: Sequence[int]) -> str:
    """``[160, 128]``."""
    return "[" + ", ".join(map(str, shape)) + "]"


def one_line(text: str, width: int = 72) -> str:
    """The first line of ``text``, cut to ``width`` characters with ``...``."""
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def short_value(v: object, width: int = 60) -> str:
    """A plain value in one short line (bytes as their length)."""
    if isinstance(v, bytes):
        return f"<{len(v)} bytes>"
    return one_line(repr(v), width)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[str] = ()
          ) -> str:
    """Aligned text table; ``right`` holds the header names of right-aligned (numeric) columns.

    The last column is not padded, so lines carry no trailing blanks.
    """
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = []
        for i, c in enumerate(r):
            last = i == len(r) - 1
            if headers[i] in right:
                parts.append(c.rjust(widths[i]))
            else:
                parts.append(c if last else c.ljust(widths[i]))
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def jsonable(v: Any) -> Any:
    """Plain JSON: non-finite floats become strings, bytes their length and sha256, datetimes
    ISO 8601 text."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, bytes):
        return {"bytes": len(v), "sha256": hashlib.sha256(v).hexdigest()}
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, _dt.datetime):
        return v.isoformat()
    return v
