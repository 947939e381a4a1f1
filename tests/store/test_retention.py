"""Retention given once (``ckptstore.open(url, keep=...)``, issue 26 item 18): the last k, every
n-th, the best k by a metric, tags always; applied after each commit lands (``commit_async``
too, in the background, never a commit behind); never what a kept commit or another writer
builds on."""

from __future__ import annotations

import pytest
import torch

import ckptstore
from ckptstore import BestN, EveryN, LatestN, Policy
from ckptstore.policy.retention import Candidate


def _line(*metadata: dict) -> list[Candidate]:
    """Candidates newest first; c1, the oldest, has generation 0."""
    n = len(metadata)
    return [Candidate(f"c{n - i}", n - i - 1, m) for i, m in enumerate(metadata)]


def test_rules_select_along_a_line():
    line = _line({"loss": 0.5, "step": 40}, {"loss": 0.2, "step": 30}, {"step": 20},
                 {"loss": 0.2, "step": 10})  # c4 (newest) .. c1
    assert LatestN(2).select(line) == {"c4", "c3"}
    assert EveryN(2).select(line) == {"c3", "c1"}
    assert EveryN(20, key="step").select(line) == {"c4", "c2"}
    assert BestN(1, "loss").select(line) == {"c3"}  # a tie goes to the newer
    assert BestN(2, "loss", mode="max").select(line) == {"c4", "c3"}
    assert (LatestN(1) | BestN(1, "loss") | EveryN(20, key="step")).select(line) == {
        "c4", "c3", "c2"}
    assert BestN(5, "loss").select(_line({"loss": float("nan")}, {"loss": True})) == set()


def test_bad_rules_are_refused():
    with pytest.raises(ValueError, match="LatestN"):
        LatestN(0)
    with pytest.raises(ValueError, match="mode"):
        BestN(1, "loss", mode="lowest")
    with pytest.raises(TypeError, match="LatestN"):
        ckptstore.open("memory://retention-bad", keep=3)


def test_latest_n_after_each_commit(open_backend_store):
    store = open_backend_store(keep=LatestN(2))
    ids = []
    for i in range(4):
        ids.append(store.commit({"w": torch.full((64,), float(i))}).id)
        assert sorted(store.commit_ids()) == sorted(ids[-2:])
    assert [c.id for c in store.log()] == ids[:-3:-1]
    assert torch.equal(store.checkout("main~1")["w"], torch.full((64,), 2.0))
    assert store.verify().ok


def test_tags_best_and_every_n_kept(tmp_path):
    store = ckptstore.open(tmp_path / "s", keep=LatestN(1) | BestN(1, "loss") | EveryN(3))
    losses = [0.9, 0.1, 0.5, 0.7, 0.8, 0.6]
    ids = [store.commit({"w": torch.ones(8) * i}, metadata={"loss": loss},
                        tags=("first",) if i == 0 else ()).id for i, loss in enumerate(losses)]
    # generations 0..5: every 3rd is 0 and 3; the best loss is the 2nd; the tag names the 1st
    assert set(store.commit_ids()) == {ids[0], ids[1], ids[3], ids[5]}
    for c in store.commit_ids():
        assert store.checkout(c)["w"][0] == ids.index(c)
    assert store.verify().ok


def test_chain_bases_of_kept_commits_stay(tmp_path):
    store = ckptstore.open(tmp_path / "s", keep=LatestN(1),
                           policy=Policy(incremental="consecutive", delta=True, max_chain=3))
    emb, dense = torch.zeros(4096, 16), torch.randn(256, 128)
    kept = []
    for step in range(6):
        emb[step] += 1
        dense[step] += 0.5
        store.commit({"emb": emb, "dense": dense})
        got = store.checkout("main")
        assert torch.equal(got["emb"], emb) and torch.equal(got["dense"], dense)
        kept.append(len(store.commit_ids()))
    # the tip and the chain it replays back to its baseline (a new one after 3 links)
    assert kept == [1, 2, 3, 4, 1, 2] and store.verify().ok


def test_commit_async_applies_it_once_that_commit_landed(tmp_path):
    store = ckptstore.open(tmp_path / "s", keep=LatestN(1))
    for i in range(3):
        info = store.commit_async({"w": torch.full((1024,), float(i))}).wait()
        assert store.commit_ids() == [info.id]  # not a commit behind
    store.close()


def test_another_writers_work_is_never_removed(tmp_path):
    """A second client's branch tip (and what it builds on), and a commit no ref names yet
    (one in flight in another process), survive this client's retention."""
    url = tmp_path / "s"
    mine = ckptstore.open(url, keep=LatestN(1))
    theirs = ckptstore.open(url, policy=Policy(incremental="consecutive", min_rows=64))
    mine.commit({"w": torch.ones(4)})
    table = torch.zeros(256, 64)
    for step in range(3):
        table[step] += 1
        theirs.commit({"t": table}, branch="exp")
    theirs.branch("doomed", "exp")
    orphan = theirs.commit({"t": table + 1}, branch="doomed").id
    theirs.delete_branch("doomed")  # unreferenced and young: as a commit in flight elsewhere
    for i in range(3):
        mine.commit({"w": torch.ones(4) * i})
    assert orphan in mine.commit_ids()
    assert torch.equal(theirs.checkout(orphan)["t"], table + 1)
    table[5] += 1
    theirs.commit({"t": table}, branch="exp")  # their chain goes on from their tip
    assert torch.equal(mine.checkout("exp")["t"], table)
    assert len([c for c in mine.commit_ids()]) == 1 + 4 + 1  # main's tip, exp's line, orphan
    assert mine.verify().ok


def test_dcp_saves_apply_it_too(tmp_path):
    """``dcp.save`` through ``ckptstore.dcp.StorageWriter`` (the coordinator's finish) applies
    the store's retention as ``Store.commit`` does."""
    import warnings

    import torch.distributed.checkpoint as dcp

    from ckptstore.dcp import StorageWriter

    store = ckptstore.open(tmp_path / "s", keep=LatestN(1))
    assert store.keep == LatestN(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for i in range(3):
            dcp.save({"w": torch.full((8,), float(i))}, storage_writer=StorageWriter(store),
                     no_dist=True)
            assert len(store.commit_ids()) == 1
    assert torch.equal(store.checkout("main")["w"], torch.full((8,), 2.0))


def test_ref_files_do_not_pile_up(tmp_path):
    """A store that relies on retention alone (no gc) keeps a bounded number of ref files."""
    store = ckptstore.open(tmp_path / "s", keep=LatestN(2))
    for i in range(12):
        store.commit({"w": torch.full((4,), float(i))})
    assert len(list((tmp_path / "s" / "refs" / "heads" / "main").iterdir())) <= 8
    assert torch.equal(store.checkout("main")["w"], torch.full((4,), 11.0))
    assert store.verify().ok


def test_a_failure_to_apply_it_never_fails_the_landed_commit(tmp_path):
    """A damaged old manifest stops the retention pass (a RetentionWarning), not the commit."""
    from ckptstore.format.layout import manifest_key
    from ckptstore.policy.retention import RetentionWarning

    store = ckptstore.open(tmp_path / "s", keep=BestN(1, "loss"))
    first = store.commit({"w": torch.ones(4)}, metadata={"loss": 1.0}).id
    store.commit({"w": torch.ones(4) * 2}, metadata={"loss": 2.0})
    (tmp_path / "s" / manifest_key(first)).write_bytes(b"not a manifest")
    store.repo.forget(first)
    with pytest.warns(RetentionWarning, match="landed"):
        info = store.commit({"w": torch.ones(4) * 3}, metadata={"loss": 3.0})
    assert store.resolve("main") == info.id
    assert torch.equal(store.checkout("main")["w"], torch.ones(4) * 3)


def test_sharded_commits_apply_it_too(tmp_path):
    """A sharded commit assembled from ranks' parts (``ckptstore.dcp.shards.commit_shards``)
    applies the store's retention as ``Store.commit`` does."""
    from ckptstore.dcp.shards import LocalTensor, commit_shards

    store = ckptstore.open(tmp_path / "s", keep=LatestN(2))
    for i in range(4):
        blocks = [[LocalTensor("w", (4 * r,), (8,), torch.full((4,), float(i + r)))]
                  for r in range(2)]
        commit_shards(store, blocks)
    assert len(store.commit_ids()) == 2
    assert torch.equal(store.checkout("main")["w"], torch.tensor([3.0] * 4 + [4.0] * 4))
