"""Tiered stores (issue 29): commits land on a local tier and upload to the remote in order.

The remote is the moto S3 server (``s3_server``) where processes share it, else a second local
directory: its uploads fail for real while a regular file sits where its ``data`` folder goes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

import ckptstore
from ckptstore import LatestN, UploadError
from ckptstore.cli import main as ckpt
from ckptstore.tiers import UploadBudgetWarning, UploadWarning

CHILD = Path(__file__).with_name("tier_child.py")


def state(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {"a": torch.randn(64, 64, generator=g), "b": torch.randn(300, generator=g)}


def same(x: dict, y: dict) -> bool:
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def s3_url() -> str:
    return f"s3://ckpt-tests/tiers-{uuid.uuid4().hex[:8]}"


def block(remote: Path) -> None:
    """Make every chunk upload to the local remote fail (a file where its data folder goes)."""
    (remote / "data").write_bytes(b"not a folder")


def unblock(remote: Path) -> None:
    (remote / "data").unlink()


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    remote = tmp_path / "remote"
    ckptstore.open(remote).close()
    return tmp_path / "local", remote


@pytest.mark.s3
def test_uploads_in_commit_order_and_another_client_sees_them(tmp_path, s3_server):
    url = s3_url()
    with ckptstore.open(url, local=tmp_path / "local", **s3_server) as store:
        infos = [store.commit(state(0), message="c0"), store.commit(state(1), message="c1",
                                                                    tags=["best"])]
        infos.append(store.commit_async(state(2), message="c2").wait())
        store.push()
        assert [u.state for u in store.uploads] == ["uploaded"] * 3
        assert [u.commit for u in store.uploads] == [i.id for i in infos]
    other = ckptstore.open(url, create=False, skip_instance_cache=True, **s3_server)
    assert [c.message for c in other.log()] == ["c2", "c1", "c0"]
    assert other.tags() == {"best": infos[1].id}
    assert same(other.checkout("main~1"), state(1))
    assert other.verify().ok
    assert not list((tmp_path / "local" / ".uploads" / "queue").iterdir())


@pytest.mark.s3
def test_kill_during_uploads_loses_nothing_and_resumes(tmp_path, s3_server):
    url, local = s3_url(), tmp_path / "local"
    ckptstore.open(url, **s3_server).close()
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(local), url, json.dumps(s3_server), "3", "20"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    returned = [line.split()[1] for line in proc.stdout.splitlines()
                if line.startswith("committed")]
    assert len(returned) >= 2  # a commit uploads 13 keys: the 20th is the second's
    reader = ckptstore.open(url, create=False, skip_instance_cache=True, **s3_server)
    assert [c.id for c in reader.log()] == returned[:1]  # the second's chunks are half there
    assert reader.verify().ok  # what the remote shows is whole
    with ckptstore.open(url, local=local, **s3_server) as store:  # resumes the journal
        store.push()
        local_log = [c.id for c in store.log()]
    assert set(returned) <= set(local_log)
    reader = ckptstore.open(url, create=False, skip_instance_cache=True, **s3_server)
    assert [c.id for c in reader.log()] == local_log
    assert reader.verify().ok


def test_failed_upload_is_local_only_then_pushed(dirs):
    local, remote = dirs
    block(remote)
    store = ckptstore.open(remote, local=local)
    info = store.commit(state(0), message="c0")
    with pytest.raises(UploadError, match="safe on the local tier"):
        store.push()
    assert [u.state for u in store.uploads] == ["failed"]
    assert same(store.checkout(), state(0))  # read from the local tier
    assert not ckptstore.open(remote, create=False).branches()  # nothing visible remotely
    unblock(remote)
    store.tag("later", info.id)  # a tag made after its commit was queued goes up with push
    store.push()
    assert ckptstore.open(remote, create=False).tags() == {"later": info.id}
    assert ckptstore.open(remote, create=False).resolve("main") == info.id
    store.close()


def test_gc_and_local_keep_never_delete_what_is_not_uploaded(dirs):
    local, remote = dirs
    block(remote)
    store = ckptstore.open(remote, local=local, local_keep=LatestN(1))
    ids = [store.commit(state(i), message=f"c{i}").id for i in range(3)]
    store.gc(keep_last=1, grace_period=0)
    assert sorted(p.stem for p in (local / "commits").iterdir()) == sorted(ids)
    assert same(store.checkout(ids[0]), state(0))
    unblock(remote)
    store.push()  # local_keep applies after each upload: the newest commit stays local
    assert [p.stem for p in (local / "commits").iterdir()] == [ids[-1]]
    assert same(store.checkout(ids[0]), state(0))  # from the remote
    assert [c.id for c in store.log()] == ids[::-1]
    store.close()


def test_full_budget_waits_and_warns(dirs):
    local, remote = dirs
    block(remote)
    store = ckptstore.open(remote, local=local, upload_budget=1)
    store.commit(state(0))
    with pytest.warns(UploadBudgetWarning), pytest.raises(UploadError):
        store.commit(state(1))  # waits for the upload, which fails again
    unblock(remote)
    with pytest.warns(UploadBudgetWarning):
        store.commit(state(1))
    store.push()
    assert len(ckptstore.open(remote, create=False).log()) == 2
    store.close()


def test_open_queues_a_commit_whose_record_was_lost(dirs):
    """A kill after the local ref moved but before the journal record: found on open."""
    local, remote = dirs
    block(remote)
    with ckptstore.open(remote, local=local) as store:
        info = store.commit(state(0))
    for record in (local / ".uploads" / "queue").iterdir():
        record.unlink()
    unblock(remote)
    with ckptstore.open(remote, local=local) as store:
        store.push()
    assert ckptstore.open(remote, create=False).resolve("main") == info.id


def test_cli_status_and_push(dirs, capsys):
    local, remote = dirs
    block(remote)
    with ckptstore.open(remote, local=local) as store:
        info = store.commit(state(0))
        with pytest.raises(UploadError):
            store.push()
    capsys.readouterr()
    assert ckpt(["status", str(local), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(u["commit"], u["state"]) for u in doc["pending"]] == [(info.id, "failed")]
    assert ckpt(["status", str(local), "--offline"]) == 0  # the journal only
    assert "1 commit" in capsys.readouterr().out
    assert ckpt(["push", str(local)]) == 5
    assert "safe on the local tier" in capsys.readouterr().err
    unblock(remote)
    assert ckpt(["push", str(local)]) == 0
    assert "1 commit uploaded" in capsys.readouterr().out
    assert ckpt(["status", str(local)]) == 0
    assert "everything is uploaded" in capsys.readouterr().out
    assert ckpt(["status", str(remote)]) == 2  # not a local tier


def test_cli_status_names_a_ranks_part(dirs, capsys):
    """A rank's part of a sharded commit queued on its local tier: ``ckpt status`` says whose."""
    from ckptstore.storage import LocalStorage
    from ckptstore.tiers import Journal

    local, remote = dirs
    block(remote)
    with ckptstore.open(remote, local=local):
        pass
    Journal(LocalStorage(local)).add("ab" * 16, "main", 10, op="part", rank=1, world=2)
    capsys.readouterr()
    assert ckpt(["status", str(local), "--offline"]) == 0
    assert "part 1/2 main" in capsys.readouterr().out
    assert ckpt(["status", str(local), "--offline", "--json"]) == 0
    (pending,) = json.loads(capsys.readouterr().out)["pending"]
    assert (pending["op"], pending["rank"], pending["world"]) == ("part", 1, 2)
    unblock(remote)


def test_options_need_a_local_tier(tmp_path):
    with pytest.raises(TypeError, match="need local="):
        ckptstore.open(tmp_path / "s", local_keep=LatestN(1))
    assert os.listdir(tmp_path) == []


def test_opens_and_commits_while_the_remote_does_not_answer(tmp_path):
    local, remote = tmp_path / "local", tmp_path / "remote"
    remote.write_bytes(b"")  # a remote that cannot be read (a file where its folder goes)
    with pytest.warns(UploadWarning, match="does not answer"):
        store = ckptstore.open(remote, local=local)
    info = store.commit(state(0))
    with pytest.raises(UploadError):
        store.push()
    remote.unlink()
    remote.mkdir()
    store.push()  # the remote store is made by the first upload
    assert ckptstore.open(remote, create=False).resolve("main") == info.id
    store.close()


def test_wait_uploaded_waits_for_this_commit(dirs):
    local, remote = dirs
    block(remote)
    store = ckptstore.open(remote, local=local)
    first = store.commit_async(state(0), message="c0")
    with pytest.raises(UploadError, match="safe on the local tier"):
        first.wait(uploaded=True)
    assert first.wait().message == "c0"  # durable locally all the same
    assert not ckptstore.open(remote, create=False).branches()
    unblock(remote)
    second = store.commit_async(state(1), message="c1")
    info = second.wait(uploaded=True, timeout=60)  # the first (before it) goes up too
    reader = ckptstore.open(remote, create=False)
    assert [c.message for c in reader.log()] == ["c1", "c0"]
    assert reader.resolve("main") == info.id
    assert same(reader.checkout(info.id), state(1))
    assert first.wait(uploaded=True).id == reader.resolve("main~1")  # uploaded: at once
    store.close()


def test_wait_uploaded_needs_a_tiered_store(tmp_path):
    with ckptstore.open(tmp_path / "s") as store:
        pending = store.commit_async(state(0))
        with pytest.raises(ckptstore.PendingCommitError, match="needs a tiered store"):
            pending.wait(uploaded=True)
        assert same(store.checkout(pending.wait().id), state(0))
