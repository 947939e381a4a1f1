"""History: what a store holds, by name -- commit manifests (``manifest``), branches and tags
(``refs``), the revision grammar (``revparse``) and the ``Repository`` that ties them to a storage
with its chunk I/O pool.

May import: format, chunkcodec, storage and the top-level helpers (errors, limits, info, priority,
progress, _version).
"""
