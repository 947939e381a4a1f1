"""Progress bars for long reads (verify, diff, export): tqdm on stderr, or nothing.

Callers decide ``enabled`` (the CLI: ``--progress``, else only when stderr is a terminal and the
output is not ``--json``); a disabled bar costs nothing and prints nothing. tqdm is imported only
when a bar is made, so importing this module stays cheap.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tqdm import tqdm

__all__ = ["bar"]


def bar(total: int, desc: str, enabled: bool, unit: str = "B") -> tqdm:
    """A tqdm bar on stderr, silent unless ``enabled``; bytes are shown in KiB, MiB, ..."""
    from tqdm import tqdm

    scale = {"unit_scale": True, "unit_divisor": 1024} if unit == "B" else {}
    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, leave=False,
                file=sys.stderr, **scale)
