"""Branch and tag changes on a tiered store are replayed on its remote, in upload order
(issue 29, ``ckptstore.tiers.refops``): a branch made, moved or deleted and a tag deleted show
on the remote after ``push``; a commit made after a ``reset_branch`` uploads (before, its
parent was not the remote tip and the upload queue stopped); a change journalled but not
replayed when the process died is replayed by the next open."""

from __future__ import annotations

import uuid

import msgpack
import pytest
import torch

import ckptstore
from ckptstore.storage import open_storage
from ckptstore.tiers import Journal


def state(step: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((32,), float(step))}


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def remote(request, tmp_path) -> tuple[str, dict]:
    """``(url, storage options)`` of an empty remote: a directory, or a prefix on moto S3."""
    if request.param == "local":
        return str(tmp_path / "remote"), {}
    options = {**request.getfixturevalue("s3_server"), "skip_instance_cache": True}
    return f"s3://ckpt-tests/tier-refs-{uuid.uuid4().hex[:8]}", options


def test_branch_and_tag_changes_reach_the_remote_in_order(tmp_path, remote):
    url, options = remote
    with ckptstore.open(url, local=tmp_path / "local", **options) as store:
        a, b = store.commit(state(0)).id, store.commit(state(1)).id
        store.tag("first", a)
        store.tag("second", b)
        store.branch("side", a)
        store.reset_branch("main", a)
        store.push()
        seen = ckptstore.open(url, create=False, **options)
        assert seen.resolve("main") == a and seen.resolve("side") == a
        assert seen.tags() == {"first": a, "second": b}
        c = store.commit(state(2)).id  # its parent is a: the remote branch was moved there
        store.delete_tag("first")
        store.delete_branch("side")
        store.push()
        ops = [(u.op, u.branch, u.state) for u in store.uploads if u.op != "commit"]
        assert ops == [("branch", "side", "uploaded"), ("reset", "main", "uploaded"),
                       ("delete-tag", "first", "uploaded"),
                       ("delete-branch", "side", "uploaded")]
    seen = ckptstore.open(url, create=False, **options)
    assert seen.resolve("main") == c and seen.manifest(c).parent == a
    assert seen.tags() == {"second": b} and sorted(seen.branches()) == ["main"]
    assert torch.equal(seen.checkout("main")["w"], state(2)["w"])


def test_a_change_journalled_before_a_kill_is_replayed_on_the_next_open(tmp_path):
    url, local = str(tmp_path / "remote"), tmp_path / "local"
    with ckptstore.open(url, local=local) as store:
        a, b = store.commit(state(0)).id, store.commit(state(1)).id
        store.push()
    # what a process killed right after store.reset_branch("main", a) leaves: the local ref
    # moved and the journal record written, nothing replayed
    ckptstore.open(local, create=False).reset_branch("main", a)
    rec = Journal(open_storage(str(local))).add(a, "main", 0, op="reset")
    assert rec.op == "reset" and ckptstore.open(url, create=False).resolve("main") == b
    with ckptstore.open(url, local=local) as store:
        store.push()
        c = store.commit(state(2)).id
        store.push()
    seen = ckptstore.open(url, create=False)
    assert seen.resolve("main") == c and seen.manifest(c).parent == a


def test_a_damaged_or_unknown_change_record_is_refused_clearly(tmp_path):
    local = open_storage(str(tmp_path / "local"))
    journal = Journal(local)
    with pytest.raises(ValueError, match="op must be one of"):
        journal.add("0" * 32, "main", 0, op="rename")
    local.put(".uploads/queue/000000000000", msgpack.packb(
        {"v": 2, "op": "rename", "commit": "0" * 32, "branch": "main", "bytes": 0,
         "queued": 0.0}))
    with pytest.raises(ckptstore.ManifestError, match="upload journal record .* is damaged"):
        journal.records()
