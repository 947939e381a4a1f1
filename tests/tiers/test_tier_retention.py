"""Retention per tier (issue 29): ``keep=`` is the remote's rule, ``local_keep=`` the local
tier's, ``gc(tier=...)`` collects one tier; nothing a commit not uploaded yet needs is deleted
on either tier. The remote is a second local directory or the moto S3 server (through the fault
proxy where an upload must stay queued); ``Store.wait_uploaded`` for a synchronous commit."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest
import torch

import ckptstore
from ckptstore import EncodingOptions, LatestN, Retry, TierError, UploadError
from ckptstore.cli import main as ckpt

sys.path.insert(0, str(Path(__file__).parents[1] / "reliability"))
from proxy import Fault, FaultProxy  # noqa: E402


def state(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {"a": torch.randn(64, 64, generator=g), "b": torch.randn(300, generator=g)}


def same(x: dict, y: dict) -> bool:
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def remote(request, tmp_path) -> tuple[str, dict]:
    """``(url, storage options)`` of an empty remote: a directory, or a prefix on moto S3."""
    if request.param == "local":
        return str(tmp_path / "remote"), {}
    options = {**request.getfixturevalue("s3_server"), "skip_instance_cache": True}
    return f"s3://ckpt-tests/tier-keep-{uuid.uuid4().hex[:8]}", options


def remote_commits(url: str, options: dict) -> set[str]:
    return set(ckptstore.open(url, create=False, **options).commit_ids())


def test_remote_rule_keeps_the_last_n_and_tags(tmp_path, remote):
    url, options = remote
    with ckptstore.open(url, local=tmp_path / "local", keep=LatestN(2), **options) as store:
        assert store.keep == LatestN(2)
        ids = [store.commit(state(i), message=f"c{i}", tags=["best"] if i == 1 else ()).id
               for i in range(5)]
        store.push()
        assert remote_commits(url, options) == {ids[1], ids[3], ids[4]}
        assert set(store.commit_ids()) >= set(ids)  # the local tier keeps all (no local_keep)
        assert same(store.checkout(ids[2]), state(2))  # from the local tier
    reader = ckptstore.open(url, create=False, **options)
    assert reader.tags() == {"best": ids[1]} and reader.verify().ok
    assert same(reader.checkout("main~1"), state(3))


def test_gc_of_each_tier_with_dry_run(tmp_path, remote):
    url, options = remote
    local = tmp_path / "local"
    with ckptstore.open(url, local=local, **options) as store:
        ids = [store.commit(state(i), tags=["first"] if i == 0 else ()).id for i in range(4)]
        store.push()
        dry = store.gc(tier="remote", keep_last=1, dry_run=True)
        assert dry.dry_run and sorted(dry.commits_removed) == sorted(ids[1:3])
        assert remote_commits(url, options) == set(ids)  # nothing removed
        done = store.gc(tier="remote", keep_last=1)
        assert sorted(done.commits_removed) == sorted(ids[1:3])
        assert remote_commits(url, options) == {ids[0], ids[3]}
        assert sorted(p.stem for p in (local / "commits").iterdir()) == sorted(ids)
        assert same(store.checkout(ids[1]), state(1))  # the local tier still has it
        store.gc(keep_last=1)  # tier="local"
        assert sorted(p.stem for p in (local / "commits").iterdir()) == sorted([ids[0], ids[3]])
        with pytest.raises(TierError, match="'local' or 'remote'"):
            store.gc(tier="cloud")
    with ckptstore.open(tmp_path / "plain") as plain:
        with pytest.raises(TierError, match="one tier"):
            plain.gc(tier="remote")


def test_cli_gc_of_each_tier(tmp_path, capsys):
    local, url = tmp_path / "local", str(tmp_path / "remote")
    with ckptstore.open(url, local=local) as store:
        ids = [store.commit(state(i)).id for i in range(3)]
        store.push()
    capsys.readouterr()
    assert ckpt(["gc", str(local), "--tier", "remote", "--keep-last", "1", "-n", "--json"]) == 0
    assert sorted(json.loads(capsys.readouterr().out)["commits_removed"]) == sorted(ids[:2])
    assert remote_commits(url, {}) == set(ids)
    assert ckpt(["gc", str(local), "--tier", "remote", "--keep-last", "1"]) == 0
    assert "removed 2 commits" in capsys.readouterr().out
    assert remote_commits(url, {}) == {ids[2]}
    assert ckpt(["gc", str(local), "--keep-last", "2"]) == 0  # the local tier by default
    assert sorted(p.stem for p in (local / "commits").iterdir()) == sorted(ids[1:])
    assert ckpt(["gc", url, "--tier", "remote"]) == 2  # not a local tier
    assert "not the local tier" in capsys.readouterr().err


@pytest.mark.s3
def test_what_a_queued_commit_reads_survives_remote_rules_and_gc(tmp_path, s3_server):
    """C, queued on a branch made at A, shares A's data (dedup); the remote's main moved on to
    B, and the branch at A is not replayed there yet (its ref write fails). Neither the rule
    (applied when B lands, the branch and C queued) nor gc may delete A remotely, and the local
    tier keeps everything not uploaded whatever its rule."""
    proxy = FaultProxy(s3_server["client_kwargs"]["endpoint_url"])
    url = f"s3://ckpt-tests/tier-queued-{uuid.uuid4().hex[:8]}"
    options = {**s3_server, "client_kwargs": {"endpoint_url": proxy.endpoint},
               "config_kwargs": {"retries": {"total_max_attempts": 1, "mode": "standard"}},
               "skip_instance_cache": True}
    store = ckptstore.open(url, local=tmp_path / "local", keep=LatestN(1),
                           local_keep=LatestN(1), options=EncodingOptions(dedup=True),
                           retry=Retry(attempts=2, backoff=0.01, max_backoff=0.05), **options)
    store.tiers.remote.fs.retries = 1
    big = {"w": torch.randn(512, 512, generator=torch.Generator().manual_seed(0))}
    a = store.commit(big, message="A")
    store.push()
    proxy.add(Fault("PUT", r"/commits/.*\.msgpack$", 503, times=None))  # B stays queued
    b = store.commit(state(1), message="B")
    store.branch("exp", a.id)
    c = store.commit(big, message="C", branch="exp")
    assert a.id in store.manifest(c.id).data_commits()  # C reads A's arrays
    proxy.clear()
    proxy.add(Fault("PUT", "/refs/heads/exp/", 503, times=None))  # the branch stays queued
    proxy.add(Fault("PUT", c.id, 503, times=None))  # B uploads and lands; C stays queued
    with pytest.raises(UploadError) as e:
        store.push()
    assert e.value.commit_id == a.id and store.wait_uploaded(b.id).id == b.id  # at the branch
    assert a.id in remote_commits(url, s3_server)  # the rule (LatestN(1)) kept A for C
    assert a.id in store.gc(tier="remote", keep_last=1, grace_period=0).kept
    assert {a.id, b.id} <= remote_commits(url, s3_server)
    foreign = ckptstore.open(url, create=False, skip_instance_cache=True, **s3_server)
    assert a.id in foreign.gc(keep_last=1, grace_period=0, dry_run=True).commits_removed
    store.gc(keep_last=1, grace_period=0)  # local: C is not uploaded, nor is what it reads
    assert {a.id, c.id} <= {p.stem for p in (tmp_path / "local" / "commits").iterdir()}
    assert same(store.checkout("exp"), big)
    proxy.clear()
    assert store.wait_uploaded("exp", timeout=60).id == c.id
    store.close()
    reader = ckptstore.open(url, create=False, skip_instance_cache=True, **s3_server)
    assert same(reader.checkout("exp"), big) and reader.verify().ok
    assert reader.resolve("main") == b.id
    proxy.close()


def test_wait_uploaded_after_a_synchronous_commit(tmp_path):
    local, remote = tmp_path / "local", tmp_path / "remote"
    ckptstore.open(remote).close()
    (remote / "data").write_bytes(b"not a folder")  # every chunk upload fails
    store = ckptstore.open(remote, local=local)
    info = store.commit(state(0), message="c0")
    with pytest.raises(UploadError, match="safe on the local tier"):
        store.wait_uploaded(info.id)
    (remote / "data").unlink()
    assert store.wait_uploaded(info.id, timeout=60) == info
    assert ckptstore.open(remote, create=False).resolve("main") == info.id
    assert store.wait_uploaded("main").id == info.id  # uploaded: at once
    store.close()
    with ckptstore.open(tmp_path / "plain") as plain:
        plain.commit(state(0))
        with pytest.raises(TierError, match="one tier"):
            plain.wait_uploaded("main")


def test_remote_gc_while_uploads_run(tmp_path):
    """gc of the remote in a loop on another thread while commits that share an old commit's
    data (dedup) upload and the remote's rule runs: every remote commit stays whole."""
    import threading

    url = str(tmp_path / "remote")
    frozen = torch.randn(256, 256, generator=torch.Generator().manual_seed(1))
    store = ckptstore.open(url, local=tmp_path / "local", keep=LatestN(2),
                           options=EncodingOptions(dedup=True))
    stop, results = threading.Event(), []

    def collect() -> None:
        while not stop.is_set():
            results.append(store.gc(tier="remote", keep_last=1, grace_period=0))

    collector = threading.Thread(target=collect)
    collector.start()
    try:
        last = {}
        for i in range(6):
            last = {"frozen": frozen, "w": torch.full((64,), float(i))}
            store.commit(last, branch="main" if i % 2 else "side")
        store.push()
    finally:
        stop.set()
        collector.join()
    store.close()
    assert results  # gc ran meanwhile
    reader = ckptstore.open(url, create=False)
    assert reader.verify().ok
    assert same(reader.checkout("side"), {"frozen": frozen, "w": torch.full((64,), 4.0)})
    assert same(reader.checkout("main"), last)
