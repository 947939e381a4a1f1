"""Format: the bytes and keys of a store -- the one key map (``layout``), commit ids (``ids``),
tensors as zarr v3 arrays (``arrays``), the group's zarr.json and each array's ckptstore
attributes (``zarrjson``), the chunk grid (``grid``), dtype names (``dtypes``), dimension orders
(``dimorder``), and float arithmetic on stored bits (``floatbits``).

May import: chunkcodec, storage and the top-level helpers (errors, limits, info, priority, progress,
_version).
"""
