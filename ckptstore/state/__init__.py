"""State: the training state as a tree of leaves -- ``tree`` flattens a nested state (modules,
optimizers, Stateful objects, dicts) into tensor and plain leaves and back, and loads values into
live objects; ``leaves`` names a commit's leaves by dotted path, selects them by glob and sizes
them.

May import: history, format, chunkcodec, storage and the top-level helpers (errors, limits, info, priority,
progress, _version).
"""
