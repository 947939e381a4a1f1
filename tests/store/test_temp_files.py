"""The temporary files of local writes are named by storage (``storage.TEMP_PREFIX``, issue 27
item 3: the storage layer knows no store key); the key map names the same prefix, and gc removes
what an interrupted write left once the grace period is over."""

from __future__ import annotations

import os

import pytest

import ckptstore
from ckptstore.format import layout
from ckptstore.storage import TEMP_PREFIX


def test_an_interrupted_write_leaves_a_temp_file_that_gc_removes(tmp_path, monkeypatch):
    assert layout.TEMP_PREFIX == TEMP_PREFIX
    store = ckptstore.open(tmp_path / "s")
    store.commit({"x": 1})
    folder = tmp_path / "s" / layout.COMMITS
    before = set(os.listdir(folder))

    def refuse(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(os, "replace", refuse)  # the write is interrupted before its rename
        with pytest.raises(OSError):
            store.storage.put(f"{layout.COMMITS}/leftover", b"partial")
    left = set(os.listdir(folder)) - before
    assert len(left) == 1 and next(iter(left)).startswith(TEMP_PREFIX)
    store.gc(grace_period=3600)
    assert set(os.listdir(folder)) - before == left  # within the grace period: kept
    store.gc(grace_period=0)
    assert set(os.listdir(folder)) == before
    assert store.checkout()["x"] == 1
    store.close()
