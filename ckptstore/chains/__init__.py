"""Chains of commits: deciding (decide), remembering (memory), replaying (replay), and the one
walk of what a commit reads (walk). See :mod:`ckptstore.chains.walk` for the entry kinds.

May import: state, history, format, chunkcodec, storage, policy, tracking and the top-level helpers
(errors, limits, info, priority, progress, _version).
"""
