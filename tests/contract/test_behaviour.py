"""One behaviour suite, run against every back-end (local directory, memory://, S3 server)."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_bit_exact

import ckptstore
from ckptstore.errors import ConcurrentUpdateError, NotAStoreError, RefExists, RefNotFound


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"emb": torch.randn(4000, 64, generator=g), "bias": torch.randn(7, generator=g),
            "step": seed, "name": f"run-{seed}"}


def test_commit_checkout_log(backend_store):
    infos = [backend_store.commit(_state(i), message=f"c{i}") for i in range(3)]
    assert [c.id for c in backend_store.log()] == [i.id for i in reversed(infos)]
    assert infos[1].parent == infos[0].id and infos[0].parent is None
    assert infos[2].step == 2 and infos[0].logical_bytes == 4000 * 64 * 4 + 7 * 4
    assert 0 < infos[0].stored_bytes <= infos[0].logical_bytes + 4096
    for i, info in enumerate(infos):
        assert_bit_exact(backend_store.checkout(info.id), _state(i))
    assert_bit_exact(backend_store.checkout("main~2"), _state(0))


def test_reopen_sees_everything(backend_store, store_url):
    info = backend_store.commit(_state(5), tags=["best"])
    url, opts = store_url
    again = ckptstore.open(url, create=False, **opts)
    assert again.resolve("best") == info.id
    assert_bit_exact(again.checkout("best"), _state(5))


def test_open_missing_without_create(backend_store, store_url):
    url, opts = store_url
    with pytest.raises(NotAStoreError, match="create=False"):
        ckptstore.open(url + "-absent", create=False, **opts)


def test_tags_and_branches(backend_store):
    a = backend_store.commit(_state(1))
    b = backend_store.commit(_state(2))
    backend_store.tag("first", a.id[:8])
    with pytest.raises(RefExists):
        backend_store.tag("first", "main")
    assert backend_store.tags() == {"first": a.id}
    backend_store.branch("exp", "first")
    c = backend_store.commit(_state(3), branch="exp")
    assert c.parent == a.id
    assert backend_store.branches() == {"main": b.id, "exp": c.id}
    backend_store.delete_tag("first")
    with pytest.raises(RefNotFound):
        backend_store.resolve("first")


def test_stale_writer_loses_cleanly(backend_store):
    backend_store.commit(_state(1))
    tip = backend_store.refs.tip("main")
    backend_store.commit(_state(2))  # another writer moved the branch
    with pytest.raises(ConcurrentUpdateError, match="Nothing is lost") as err:
        backend_store.refs.advance("main", tip, backend_store.log()[1].id)
    assert err.value.branch == "main"


def test_gc_and_verify(backend_store):
    infos = [backend_store.commit(_state(i)) for i in range(4)]
    backend_store.tag("keep", infos[0].id)
    dry = backend_store.gc(keep_last=1, dry_run=True)
    assert sorted(dry.commits_removed) == sorted([infos[1].id, infos[2].id])
    assert len(backend_store.commit_ids()) == 4
    res = backend_store.gc(keep_last=1)
    assert res.bytes_freed > 2 * 4000 * 64 * 4 * 0.8
    assert sorted(backend_store.commit_ids()) == sorted([infos[0].id, infos[3].id])
    report = backend_store.verify()
    assert report.ok and report.commits_checked == 2
    assert_bit_exact(backend_store.checkout("keep"), _state(0))


def test_partial_checkout_reads_selected(backend_store):
    backend_store.commit({"model": {"emb.weight": torch.ones(3000, 8), "fc.bias": torch.zeros(3)},
                          "step": 1})
    out = backend_store.checkout("main", paths=["model.emb.*"])
    assert list(out) == ["model"] and list(out["model"]) == ["emb.weight"]


def test_chains_and_async_on_every_backend(backend_store):
    from ckptstore import Policy, QuantSpec

    backend_store.policy = Policy(incremental="consecutive", delta=True,
                                  quantize=QuantSpec(method="kmeans", bits=4,
                                                     granularity="tensor", protect=0.01),
                                  overrides=(("emb", None),))
    emb, dense = torch.zeros(4096, 16), torch.randn(256, 128)
    for step in range(3):
        emb[step] += 1
        dense[step] += 0.5
        info = backend_store.commit_async({"emb": emb, "dense": dense}).wait()
    kinds = {e.path: e.kind for e in backend_store.manifest(info.id).tensors}
    assert kinds == {"emb": "consecutive", "dense": "delta"}
    out = backend_store.checkout("main")
    assert torch.equal(out["emb"], emb)
    assert float((out["dense"] - dense).abs().max()) < 0.5
    assert backend_store.gc(keep_last=1, grace_period=0).commits_removed == []  # all are bases
    assert backend_store.verify().ok
