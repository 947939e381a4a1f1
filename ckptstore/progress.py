"""Progress bars for long reads (diff, export): tqdm on stderr, or nothing."""

from __future__ import annotations

from tqdm import tqdm

__all__ = ["bar"]


def bar(total: int, desc: str, enabled: bool, unit: str = "B") -> tqdm:
    """A tqdm bar on stderr, silent unless ``enabled``; bytes are shown in KiB, MiB, ..."""
    scale = {"unit_scale": True, "unit_divisor": 1024} if unit == "B" else {}
    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, leave=False, **scale)
