"""The manifest cache is bounded by entries, not only by manifests: a training process that
commits a state of many tensors keeps a few MB of decoded manifests, not hundreds; history
walks and retention read cached summaries, so evicted manifests are not decoded again."""

from __future__ import annotations

import gc

import pytest
import torch

import ckptstore
from ckptstore import Policy
from ckptstore.history import repository
from ckptstore.history.manifest import Manifest
from ckptstore.policy.retention import LatestN


def state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"emb": torch.randn(2048, 16, generator=g),
            **{f"layer{i}": torch.randn(8, generator=g) for i in range(60)}, "step": step}


def test_cached_manifests_stay_within_the_entry_budget(tmp_path, monkeypatch):
    """With a budget of 200 entries, 30 commits of 62 entries (61 tensors and the commit)
    leave the newest MIN_CACHED manifests decoded (kept whatever their size); the process
    holds no more; log, a revision 25 commits back and a checkout of the first commit read the
    others again."""
    monkeypatch.setattr(repository, "CACHED_ENTRIES", 200)
    with ckptstore.open(tmp_path / "s") as store:
        ids = [store.commit(state(i)).id for i in range(30)]
        manifests, entries = store.repo.cached_manifests
        assert manifests == repository.MIN_CACHED and entries == repository.MIN_CACHED * 62
        gc.collect()
        alive = {m.id for m in gc.get_objects() if isinstance(m, Manifest)}
        assert len(alive & set(ids)) <= repository.MIN_CACHED
        assert [c.id for c in store.log()] == ids[::-1]
        assert store.resolve("main~25") == ids[4]
        assert torch.equal(store.checkout(ids[0])["emb"], state(0)["emb"])
        assert store.repo.cached_manifests[0] == repository.MIN_CACHED


@pytest.mark.parametrize("incremental", ["off", "consecutive"])
def test_retention_after_each_commit_decodes_no_old_manifest(tmp_path, monkeypatch,
                                                             incremental):
    """keep=LatestN(12) beside a cache of four manifests: each commit's retention walks the
    kept line and the chains' bases from summaries -- no manifest is decoded after it was
    written -- and keeps what rebuilds the kept commits (consecutive increments: their chains
    back to the full baseline)."""
    monkeypatch.setattr(repository, "CACHED_ENTRIES", 100)
    decoded: list[str] = []
    real = repository.decode_manifest

    def counting(data: bytes, where: str = "manifest") -> Manifest:
        decoded.append(where)
        return real(data, where)

    monkeypatch.setattr(repository, "decode_manifest", counting)
    policy = Policy(incremental=incremental, min_rows=1024, max_chain=5)
    with ckptstore.open(tmp_path / "s", policy=policy, keep=LatestN(12)) as store:
        ids = [store.commit(state(i)).id for i in range(30)]
        assert decoded == []
        kept = store.reachable()
        assert set(ids[-12:]) <= set(kept)
        for c in ids[-12:]:
            assert torch.equal(store.checkout(c)["emb"], state(ids.index(c))["emb"])
    if incremental == "off":
        assert sorted(kept) == sorted(ids[-12:])
