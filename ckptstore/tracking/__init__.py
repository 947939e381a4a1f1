"""Tracking: what training tells the store -- touched embedding rows (``rows``, ``rowbits``), row
access statistics and hot rows (``hotrows``), resumable data order and RNG state (``resume``),
moving averages of gradients for sensitivity ranking (``gradients``: ``GradientEMA``).

May import: state, history, format, chunkcodec, storage and the top-level helpers (errors, limits, info,
priority, progress, _version).
"""
