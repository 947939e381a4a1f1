"""Dangling commits (issue 26, item 3): a commit newer than a branch tip that continues it but
that no ref names -- the newest ref file was lost, or a commit stopped before its ref moved --
is reported by verify (as git fsck does: listed, not a failure) and kept whole by gc, with its
chain bases, through the grace period; on every back-end."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_bit_exact

from ckptstore.format.layout import branch_seq

def _state(n: int) -> dict:
    return {"w": torch.full((16, 4), float(n)), "step": n}


def _commits(store, n: int) -> list[str]:
    return [store.commit(_state(i)).id for i in range(n)]


def _lose_newest_ref_files(store, count: int = 1) -> None:
    seqs = sorted(int(s) for s in store.storage.listdir("refs/heads/main"))
    for seq in seqs[-count:]:
        store.storage.delete(branch_seq("main", seq))


@pytest.mark.every_backend
def test_a_lost_ref_file_is_reported_and_its_commit_kept(store):
    ids = _commits(store, 3)
    _lose_newest_ref_files(store)
    assert store.resolve("main") == ids[1]  # the branch rolled back silently
    report = store.verify()
    assert report.problems == []
    [dangling] = report.dangling
    assert ids[2] in dangling and "reset_branch('main'" in dangling
    kept = store.gc(keep_last=1)
    assert ids[2] in kept.kept and ids[2] not in kept.commits_removed
    assert ids[2] not in kept.data_removed
    assert_bit_exact(store.checkout(ids[2]), _state(2))
    store.reset_branch("main", ids[2])  # what the report says to do
    report = store.verify()
    assert report.ok and report.dangling == []


@pytest.mark.every_backend
def test_a_dangling_line_is_one_report_and_kept_whole(store):
    ids = _commits(store, 4)
    _lose_newest_ref_files(store, 2)
    [dangling] = store.verify().dangling
    assert ids[3] in dangling and "2 commits" in dangling
    result = store.gc(keep_last=1)
    assert {ids[2], ids[3]} <= set(result.kept)
    store.reset_branch("main", ids[3])
    assert [c.id for c in store.log()][:3] == ids[:0:-1]


@pytest.mark.every_backend
def test_a_rollback_on_purpose_is_not_dangling(store):
    ids = _commits(store, 3)
    store.reset_branch("main", ids[0])  # its ref history still names ids[2]
    assert store.verify().dangling == []
    assert {ids[1], ids[2]} <= set(store.gc(keep_last=1, grace_period=0).commits_removed)


@pytest.mark.every_backend
def test_a_new_commit_on_the_branch_releases_it(store):
    ids = _commits(store, 3)
    _lose_newest_ref_files(store)
    new = store.commit(_state(9)).id  # the branch goes on from ids[1]: ids[2] is left behind
    assert store.resolve("main") == new
    assert store.verify().dangling == []
    assert ids[2] in store.gc(keep_last=1, grace_period=0).commits_removed


@pytest.mark.every_backend
def test_past_the_grace_period_gc_removes_it(store):
    ids = _commits(store, 3)
    _lose_newest_ref_files(store)
    result = store.gc(keep_last=1, grace_period=0)
    assert ids[2] in result.commits_removed and ids[2] in result.data_removed
    assert store.verify().dangling == []


def test_ckpt_verify_prints_it_and_exits_0(tmp_path, capsys):
    import ckptstore
    from ckptstore.cli import main

    with ckptstore.open(tmp_path / "s") as store:
        ids = _commits(store, 2)
        _lose_newest_ref_files(store)
    assert main(["verify", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert f"dangling: commit {ids[1]} continues branch 'main'" in out and "ok: checked" in out
