"""Chains of commits: deciding (decide), remembering (memory), replaying (replay), and the one
walk of what a commit reads (walk). See :mod:`ckptstore.chains.walk` for the entry kinds."""
