"""Policies: how tensors are encoded, when chains rebase, how many bits a restore budget allows,
which commits a store keeps.

May import: state, history, format, chunkcodec, storage, chains, tracking and the top-level helpers
(errors, limits, info, priority, progress, _version).
"""

from .autotune import TableChoice, Tuning, autotune
from .bitwidth import BitWidth
from .encoding import Decision, Policy, QuantSpec, Want
from .frequency import Frequency, cpr_interval
from .rebase import Intermittent, MaxChain, RebasePredictor
from .retention import AnyOf, BestN, EveryN, LatestN, Retention
from .recovery import LostSamples, RecoveryCosts, RecoveryPlan, plan_recovery, pls_interval
from .search import QualitySearch, simulate
from .shrink import Shrink

__all__ = [
           "AnyOf",
           "BestN",
           "BitWidth",
           "Decision",
           "EveryN",
           "Frequency",
           "Intermittent",
           "LatestN",
           "LostSamples",
           "MaxChain",
           "Policy",
           "QualitySearch",
           "QuantSpec",
           "RebasePredictor",
           "RecoveryCosts",
           "RecoveryPlan",
           "Retention",
           "Shrink",
           "TableChoice",
           "Tuning",
           "autotune",
           "cpr_interval",
           "plan_recovery",
           "pls_interval",
           "simulate",
]
