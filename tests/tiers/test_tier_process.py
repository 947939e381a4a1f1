"""A tiered store's persist process (issue 28): commits are encoded and land on the local tier
in a process of their own; the journal and the uploads stay in the store's process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid

import pytest
import torch

import ckptstore
from ckptstore import LatestN, Policy
from ckptstore.commit.auto import AutoCommitter


def state(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {"emb": torch.randn(2048, 16, generator=g), "w": torch.randn(64, 64, generator=g)}


def same(x: dict, y: dict) -> bool:
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def in_process(store: ckptstore.Store) -> None:
    store.reserve(state(0)).result()  # waits for the process to start
    assert isinstance(store.committer, AutoCommitter) and store.committer.way == "process"


def test_commits_land_locally_in_the_process_and_upload_from_the_store(tmp_path):
    local, remote = tmp_path / "local", tmp_path / "remote"
    with ckptstore.open(remote, local=local) as store:
        assert store.committer.spec.local == str(local)
        in_process(store)
        ids = [store.commit_async(state(i), tags=[f"v{i}"] if i == 1 else ()).wait().id
               for i in range(3)]
        assert store.committer.way == "process"
        assert sorted(p.stem for p in (local / "commits").iterdir()) == sorted(ids)
        store.push()
        assert [u.state for u in store.uploads] == ["uploaded"] * 3
        assert [c.id for c in store.log()] == ids[::-1]
    with ckptstore.open(remote, create=False, background="thread") as other:
        assert [c.id for c in other.log()] == ids[::-1] and other.tags() == {"v1": ids[1]}
        for i, commit in enumerate(ids):
            assert same(other.checkout(commit), state(i))


def test_the_remote_rule_stays_off_the_local_tier(tmp_path):
    """keep= is the remote's rule, applied after each upload by the store's process: the persist
    process does not apply it to the local tier."""
    local, remote = tmp_path / "local", tmp_path / "remote"
    with ckptstore.open(remote, local=local, keep=LatestN(1)) as store:
        in_process(store)
        ids = [store.commit_async(state(i)).wait().id for i in range(3)]
        store.push()
    assert sorted(p.stem for p in (local / "commits").iterdir()) == sorted(ids)
    assert [p.stem for p in (remote / "commits").iterdir()] == [ids[-1]]


def test_local_keep_removes_uploaded_commits_beside_the_process(tmp_path):
    """local_keep (the store's process, after each upload) removes uploaded commits from the
    local tier while the persist process goes on with its increments: their base stays local,
    the others are read from the remote."""
    local, remote = tmp_path / "local", tmp_path / "remote"
    policy = Policy(incremental="one-shot", max_chain=8)
    with ckptstore.open(remote, local=local, local_keep=LatestN(1), policy=policy) as store:
        in_process(store)
        states, ids = [], []
        for i in range(4):
            s = state(0)
            s["emb"][i * 10:i * 10 + 5] += i + 1  # a few rows change: increments
            states.append(s)
            ids.append(store.commit_async(s).wait().id)
            store.push()
        kinds = {e.path: e.kind.value for e in store.manifest(ids[-1]).tensors}
        assert kinds["emb"] != "full"  # an increment on the first commit
        assert sorted(p.stem for p in (local / "commits").iterdir()) == sorted(
            [ids[0], ids[-1]])  # the newest and the base it reads
        for s, commit in zip(states, ids):
            assert same(store.checkout(commit), s)
    with ckptstore.open(remote, create=False, background="thread") as other:
        assert same(other.checkout(), states[-1])


def test_a_remote_only_this_process_holds_keeps_the_thread(tmp_path):
    with ckptstore.open(f"memory://tier-{uuid.uuid4().hex[:8]}", local=tmp_path / "l") as store:
        assert not isinstance(store.committer, AutoCommitter)
    with pytest.raises(ValueError, match="memory://"):
        ckptstore.open(f"memory://tier-{uuid.uuid4().hex[:8]}", local=tmp_path / "l2",
                       background="process")


@pytest.mark.s3
def test_an_s3_remote_gets_the_process_and_another_client_sees_the_uploads(tmp_path,
                                                                           s3_server):
    url = f"s3://ckpt-tests/tier-process-{uuid.uuid4().hex[:8]}"
    with ckptstore.open(url, local=tmp_path / "local", **s3_server) as store:
        in_process(store)
        ids = [store.commit_async(state(i)).wait().id for i in range(2)]
        store.push()
    with ckptstore.open(url, create=False, background="thread", **s3_server) as other:
        assert [c.id for c in other.log()] == ids[::-1]
        assert same(other.checkout(ids[0]), state(0))


def test_an_open_waits_for_a_commit_an_earlier_persist_process_still_lands(tmp_path):
    """Training killed while its persist process lands a commit: the persist process holds the
    local tier's landing lock until its ref moved, and a new open waits for it before it
    reconciles -- so that commit is queued and uploaded, and the next one builds on it."""
    local, remote = tmp_path / "local", tmp_path / "remote"
    with ckptstore.open(remote, local=local) as store:
        first = store.commit(state(0)).id
        store.push()
    orphan = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time, torch
        from ckptstore.opening import open_tier
        from ckptstore.tiers.landing import landing
        store = open_tier({str(remote)!r}, {str(local)!r})
        with landing(store.storage.local):
            print("holding", flush=True)
            time.sleep(1.5)  # a long persist
            g = torch.Generator().manual_seed(1)
            print(store.commit({{"emb": torch.randn(2048, 16, generator=g),
                                 "w": torch.randn(64, 64, generator=g)}}).id, flush=True)
    """)], stdout=subprocess.PIPE, text=True)
    assert orphan.stdout.readline().strip() == "holding"
    with ckptstore.open(remote, local=local) as store:  # waits for the landing
        landed = orphan.stdout.readline().strip()
        assert [u.commit for u in store.uploads] == [landed]  # queued by the open
        third = store.commit(state(2)).id
        store.push()
    assert orphan.wait(30) == 0
    with ckptstore.open(remote, create=False, background="thread") as other:
        assert [c.id for c in other.log()] == [third, landed, first]
        assert same(other.checkout(landed), state(1))


def test_local_keep_spares_a_commit_not_journalled_yet(tmp_path, monkeypatch):
    """A commit_async commit is journalled once its handle completes; local_keep, applied
    after an upload meanwhile, must not delete it although a newer commit is the local tip."""
    from ckptstore.storage import LocalStorage
    from ckptstore.tiers import journal

    local, remote = tmp_path / "local", tmp_path / "remote"
    put, add, calls = LocalStorage.put_chunk, journal.Journal.add, [0]

    def slow_remote(self, key, data):  # the first upload takes a while
        if self.root.startswith(str(remote)):
            time.sleep(0.05)
        return put(self, key, data)

    def slow_record(self, *args, **kwargs):  # the second commit's record: a slow fsync
        calls[0] += 1
        if calls[0] == 2:
            time.sleep(2.0)
        return add(self, *args, **kwargs)

    monkeypatch.setattr(LocalStorage, "put_chunk", slow_remote)
    monkeypatch.setattr(journal.Journal, "add", slow_record)
    with ckptstore.open(remote, local=local, local_keep=LatestN(1),
                        background="thread") as store:
        ids = [store.commit(state(0)).id]
        ids += [store.commit_async(state(i)).wait().id for i in (1, 2)]
        time.sleep(2.5)  # the first upload landed and its rule ran
        store.push()
    with ckptstore.open(remote, create=False, background="thread") as other:
        assert [c.id for c in other.log()] == ids[::-1]
        assert same(other.checkout(ids[1]), state(1))


def test_local_gc_works_while_the_remote_does_not_answer(tmp_path, monkeypatch):
    """What local retention spares is asked of the remote; a remote that does not answer
    spares the local tips alone, and gc(tier="local") still runs."""
    from ckptstore.storage import LocalStorage

    local, remote = tmp_path / "local", tmp_path / "remote"
    with ckptstore.open(remote, local=local, background="thread") as store:
        ids = [store.commit(state(i)).id for i in range(3)]
        store.push()
        remote_exists = LocalStorage.exists

        def unreachable(self, key):
            if self.root.startswith(str(remote)):
                raise ConnectionError("the remote does not answer")
            return remote_exists(self, key)

        monkeypatch.setattr(LocalStorage, "exists", unreachable)
        result = store.gc(tier="local", keep_last=1, grace_period=0)
        assert sorted(result.commits_removed) == sorted(ids[:2])
