"""Checkout: the way back -- ``flow`` (selection, then a new state or decoding straight into the live
one), ``reader`` (rebuild a commit's tensors, chains replayed), ``batches`` (a large state a batch
at a time) and ``consistency`` (the checks every read of a manifest's entries passes).

May import: chains, policy, device, tracking, state, history, format, chunkcodec, storage and the
top-level helpers (errors, limits, info, priority, progress, _version).
"""
