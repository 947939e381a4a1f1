"""Commit: the one commit pipeline -- plan (``plan``), capture into staging buffers where
``placement`` chose, once per item (``snapshot``, ``staging``), write (``shrinking``,
``sensitivity``, ``persist``, ``dedup``), record (``records``: the one manifest builder) and
publish; ``committer`` drives it for
``Store.commit``/``commit_async``, a rank's part of a sharded commit and DCP's StorageWriter.

May import: chains, policy, device, tracking, state, history, format, chunkcodec, storage and the
top-level helpers (errors, limits, info, priority, progress, _version).
"""
