"""Policies: how tensors are encoded, when chains rebase, how many bits a restore budget allows."""

from .bitwidth import BitWidth
from .encoding import Decision, Policy, QuantSpec
from .frequency import Frequency, cpr_interval
from .rebase import Intermittent, MaxChain, RebasePredictor
from .search import QualitySearch, simulate

__all__ = ["Policy", "QuantSpec", "Decision", "RebasePredictor", "Intermittent", "MaxChain",
           "BitWidth", "QualitySearch", "simulate", "Frequency", "cpr_interval"]
