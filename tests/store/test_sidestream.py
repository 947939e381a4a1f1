"""The snapshot's side streams (``ckptstore/commit/sidestream.py``): a batch belongs to the thread
that opened it and does not nest. Its CUDA copies run in test_cuda (CI has no GPU)."""

from __future__ import annotations

import threading

import pytest

from ckptstore.commit.sidestream import SideStreams


def test_a_batch_does_not_nest_and_is_the_opening_threads():
    side = SideStreams()
    seen: list[object] = []
    with side.batch():
        with pytest.raises(RuntimeError, match="already open"):
            with side.batch():
                pass
        other = threading.Thread(target=lambda: seen.append(getattr(side._local, "batch", None)))
        other.start()
        other.join()
    assert seen == [None]  # another thread's copies are not part of this batch
    with side.batch():  # closed: a new one opens
        pass
