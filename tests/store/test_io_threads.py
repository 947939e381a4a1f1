"""Local chunk I/O threads: the CPUs this process may use, shared among the ranks of the host."""

from __future__ import annotations

import os

import pytest

import ckptstore
from ckptstore.storage.local import cpu_share


def _usable() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def test_threads_are_the_usable_cpus_shared_by_local_ranks(monkeypatch, tmp_path):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert cpu_share() == _usable()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert cpu_share() == max(1, _usable() // 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(10 * _usable()))
    assert cpu_share() == 1
    for junk in ("", "x", "0", "-3"):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", junk)
        assert cpu_share() == _usable()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(10 * _usable()))
    store = ckptstore.open(tmp_path / "s")
    assert store.repo.io_workers == 1
    assert ckptstore.open(tmp_path / "s", io_workers=3).repo.io_workers == 3


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")
def test_an_affinity_mask_bounds_the_threads(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})
        assert cpu_share() == 1
    finally:
        os.sched_setaffinity(0, before)
