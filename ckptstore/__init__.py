"""ckptstore: a git-like, versioned store of deep-learning checkpoints on any fsspec filesystem.

>>> import ckptstore, torch
>>> store = ckptstore.open("memory://doctest")
>>> info = store.commit({"w": torch.ones(3), "step": 1}, message="first")
>>> store.checkout("main")["step"]
1
"""

from ._version import __version__

from .diff import DiffResult
from .errors import *
from .errors import __all__ as _errors_all
from .export import ExportResult
from .info import CommitInfo, GCResult, VerifyReport
from .pending import PendingCommit
from .plan import EncodingOptions
from .policy import (
                     BitWidth,
                     Frequency,
                     Intermittent,
                     MaxChain,
                     Policy,
                     QualitySearch,
                     QuantSpec,
)
from .resume import ResumableLoader, ResumableSampler, RNGState
from .store import Store, open
from .tracking import RowTracker, track
from .usage import UsageReport

__all__ = ["open", "Store", "CommitInfo", "GCResult", "VerifyReport", "EncodingOptions",
           "Policy", "QuantSpec", "BitWidth", "QualitySearch", "Intermittent", "MaxChain", "track", "RowTracker",
           "PendingCommit", "Frequency", "ResumableSampler", "ResumableLoader", "RNGState",
           "DiffResult", "UsageReport", "ExportResult", "__version__",
           *_errors_all]
