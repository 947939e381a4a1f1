"""ckptstore: a git-like, versioned store of deep-learning checkpoints on any fsspec filesystem.

>>> import ckptstore, torch
>>> store = ckptstore.open("memory://doctest")
>>> info = store.commit({"w": torch.ones(3), "step": 1}, message="first")
>>> store.checkout("main")["step"]
1
"""

__version__ = "0.1.0"

from .errors import *  # noqa: E402,F401,F403
from .errors import __all__ as _errors_all  # noqa: E402
from .info import CommitInfo, GCResult, VerifyReport  # noqa: E402
from .plan import EncodingOptions  # noqa: E402
from .policy import (BitWidth, Intermittent, MaxChain, Policy, QualitySearch,  # noqa: E402
                     QuantSpec)
from .pending import PendingCommit  # noqa: E402
from .policy import Frequency  # noqa: E402
from .resume import ResumableLoader, ResumableSampler, RNGState  # noqa: E402
from .store import Store, open  # noqa: E402
from .tracking import RowTracker, track  # noqa: E402

__all__ = ["open", "Store", "CommitInfo", "GCResult", "VerifyReport", "EncodingOptions",
           "Policy", "QuantSpec", "BitWidth", "QualitySearch", "Intermittent", "MaxChain", "track", "RowTracker",
           "PendingCommit", "Frequency", "ResumableSampler", "ResumableLoader", "RNGState",
           "__version__",
           *_errors_all]
