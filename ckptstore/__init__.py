"""ckptstore: a git-like, versioned store of deep-learning checkpoints on any fsspec filesystem.

>>> import ckptstore, torch
>>> store = ckptstore.open("memory://doctest")
>>> info = store.commit({"w": torch.ones(3), "step": 1}, message="first")
>>> store.checkout("main")["step"]
1

The names that pull in torch are imported on first use (PEP 562), so that ``import ckptstore``
and the ``ckpt`` commands that only read history start fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import *
from .errors import __all__ as _errors_all

if TYPE_CHECKING:
    from .maintenance.diff import DiffResult
    from .export import ExportResult
    from .info import CommitInfo, GCResult, VerifyReport
    from .commit.pending import PendingCommit
    from .commit.plan import EncodingOptions
    from .policy import (BestN, BitWidth, EveryN, Frequency, Intermittent, LatestN, MaxChain,
                         Policy, QualitySearch, QuantSpec)
    from .tracking.resume import ResumableLoader, ResumableSampler, RNGState
    from .tracking.gradients import GradientEMA
    from .storage.retry import Retry
    from .opening import open
    from .store import Store
    from .tracking.rows import RowTracker, track
    from .maintenance.usage import UsageReport

_LAZY = {  # public name -> the submodule it lives in
    "DiffResult": "maintenance.diff", "ExportResult": "export",
    "CommitInfo": "info", "GCResult": "info", "VerifyReport": "info",
    "PendingCommit": "commit.pending", "EncodingOptions": "commit.plan",
    "BitWidth": "policy", "Frequency": "policy", "Intermittent": "policy", "MaxChain": "policy",
    "Policy": "policy", "QualitySearch": "policy", "QuantSpec": "policy",
    "LatestN": "policy", "EveryN": "policy", "BestN": "policy",
    "ResumableLoader": "tracking.resume", "ResumableSampler": "tracking.resume", "RNGState": "tracking.resume",
    "Store": "store", "open": "opening", "RowTracker": "tracking.rows", "track": "tracking.rows",
    "UsageReport": "maintenance.usage", "GradientEMA": "tracking.gradients", "Retry": "storage.retry",
}

__all__ = ["open", "Store", "CommitInfo", "GCResult", "VerifyReport", "EncodingOptions",
           "Policy", "QuantSpec", "BitWidth", "QualitySearch", "Intermittent", "MaxChain", "track", "RowTracker",
           "LatestN", "EveryN", "BestN",
           "PendingCommit", "Frequency", "ResumableSampler", "ResumableLoader", "RNGState",
           "DiffResult", "UsageReport", "ExportResult", "GradientEMA", "Retry", "__version__",
           *_errors_all]


def __getattr__(name: str) -> Any:
    """Import a public name (or a submodule, ``ckptstore.policy``) on first use."""
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    if not name.startswith("__"):
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
