"""Policies: how tensors are encoded, when chains rebase, how many bits a restore budget allows."""

from .bitwidth import BitWidth
from .encoding import Decision, Policy, QuantSpec, Want
from .frequency import Frequency, cpr_interval
from .rebase import Intermittent, MaxChain, RebasePredictor
from .search import QualitySearch, simulate

__all__ = [
           "BitWidth",
           "Decision",
           "Frequency",
           "Intermittent",
           "MaxChain",
           "Policy",
           "QualitySearch",
           "QuantSpec",
           "RebasePredictor",
           "cpr_interval",
           "simulate",
]
