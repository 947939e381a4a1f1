"""Chains of commits: each chain kind in one module behind one protocol (kinds), the records
they speak (links), deciding (decide), remembering (memory), the helpers replays share (replay),
and the one walk of what a commit reads (walk). See :mod:`ckptstore.chains.kinds` for the kinds.

May import: device, state, history, format, chunkcodec, storage, policy, tracking and the
top-level helpers (errors, limits, info, priority, progress, _version).
"""
