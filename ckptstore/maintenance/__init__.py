"""Maintenance: looking after a store -- garbage collection (``gc``), verification (``verify``),
dangling commits (``dangling``), space use (``usage``) and differences between commits (``diff``).

May import: commit, checkout and everything below them, and the top-level helpers (errors, limits, info,
priority, progress, _version).
"""
