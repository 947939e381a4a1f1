"""Progress bars for long work (verify, diff, export, gc, rebase, du): tqdm on stderr, or nothing.

Callers decide ``enabled`` (the CLI: ``--progress``, else only when stderr is a terminal and the
output is not ``--json``). A disabled bar is a stand-in that prints nothing and does not import
tqdm, so importing this module, and running without bars, stays cheap.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tqdm import tqdm
    from typing_extensions import Self

__all__ = ["bar"]


class _Hidden:
    """What ``bar(..., enabled=False)`` returns: tqdm's methods the callers use, doing nothing."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: float = 1) -> None:
        return None

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        return None

    def close(self) -> None:
        return None


def bar(total: int, desc: str, enabled: bool, unit: str = "B") -> tqdm | Any:
    """A tqdm bar on stderr, or when not ``enabled`` a silent stand-in with the same ``update``,
    ``set_description`` and ``close``; bytes are shown in KiB, MiB, ..."""
    if not enabled:
        return _Hidden()
    from tqdm import tqdm

    scale = {"unit_scale": True, "unit_divisor": 1024} if unit == "B" else {}
    return tqdm(total=total, desc=desc, unit=unit, leave=False, file=sys.stderr, **scale)
