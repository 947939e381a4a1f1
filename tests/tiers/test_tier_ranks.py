"""Tiered commits under a process group (issue 29): 2 gloo ranks, each with a local tier of its
own, the moto S3 server behind. Each rank uploads its part of a sharded commit and a completion
object; the coordinator moves the remote ref only once every part is up (ckptstore.tiers.parts).
"""

from __future__ import annotations

import json
import uuid

import pytest
import torch
from dist_ranks import check_ranks, run_ranks
from tier_ranks import (full, killed_before_publish, local_tier, open_rank,
                        paused_part, returned)

import ckptstore
from ckptstore.errors import TierError
from ckptstore.tiers.parts import claim_rank, part_key, read_rank

pytestmark = pytest.mark.s3


def _url() -> str:
    return f"s3://ckpt-tests/ranks-{uuid.uuid4().hex[:8]}"


def _reader(url: str, opts: dict) -> ckptstore.Store:
    """A fresh client of the remote, as another machine would open it."""
    return ckptstore.open(url, create=False, skip_instance_cache=True, **opts)


def _check_remote(url: str, opts: dict, commits: list[str]) -> None:
    """The remote branch is ``commits`` (oldest first), each whole and bit for bit."""
    reader = _reader(url, opts)
    assert [c.id for c in reader.log()] == commits[::-1]
    assert reader.verify().ok
    for step, c in enumerate(commits):
        got, want = reader.checkout(c), full(step)
        assert got["step"] == step
        assert all(torch.equal(got[k], want[k]) for k in want)
    reader.close()


def test_the_remote_ref_waits_for_every_part(tmp_path, s3_server):
    """Two sharded commits with rank 1's uploads paused: the coordinator's push fails naming
    rank 1, the remote shows no commit, gc on both tiers keeps what is not published, rank 1
    recovers its shards from its local tier alone; once rank 1's parts are up the coordinator
    publishes both commits, and a fresh reader of the remote checks them out bit for bit."""
    url, root = _url(), tmp_path / "tiers"
    check_ranks(run_ranks(paused_part, 2, tmp_path / "ranks", url, s3_server, str(root)))
    ids = returned(str(root), 0)
    assert len(ids) == 2 and returned(str(root), 1) == ids
    _check_remote(url, s3_server, ids)
    reader = _reader(url, s3_server)
    for c in ids:  # every rank's completion object, inside the commit's data folder
        assert reader.storage.listdir(f"data/{c}/.parts") == ["0", "1"]
    # rank 1's local tier: the manifests and the branch (adopted), its own arrays only
    rank1 = ckptstore.open(local_tier(str(root), 1), create=False)
    assert rank1.resolve("main") == ids[1]
    arrays = rank1.storage.listdir(f"data/{ids[1]}")
    assert arrays and not any(a.startswith("r0.") or a.endswith(".r0") for a in arrays), arrays
    assert read_rank(rank1.storage).rank == 1


def test_kills_before_the_publish_lose_nothing(tmp_path, s3_server):
    """Rank 1 killed between its completion object and its journal record's removal, the
    coordinator killed before the remote manifest: the commit returned on both ranks is not on
    the remote; reopening both local tiers resumes the uploads and publishes it whole."""
    url, root = _url(), tmp_path / "tiers"
    results = run_ranks(killed_before_publish, 2, tmp_path / "ranks", url, s3_server, str(root))
    assert results == ["exit -9", "exit -9"], results
    ids = returned(str(root), 0)
    assert len(ids) == 1 and returned(str(root), 1) == ids
    reader = _reader(url, s3_server)
    assert reader.commit_ids() == [] and reader.storage.exists(part_key(ids[0], 1))
    assert not reader.storage.exists(f"commits/{ids[0]}.msgpack")
    rank1 = open_rank(url, s3_server, str(root), 1)  # the record runs again: a no-op
    rank1.push()
    rank1.close()
    with open_rank(url, s3_server, str(root), 0) as rank0:
        assert [u.op for u in rank0.uploads] == ["part"]
        rank0.push()
        assert rank0.uploads[0].state == "uploaded"
    _check_remote(url, s3_server, ids)
    for r in (0, 1):  # both journals empty
        assert not list((root / f"local{r}" / ".uploads" / "queue").iterdir())


def test_ranks_may_not_share_a_local_tier(tmp_path):
    store = ckptstore.open(tmp_path / "remote", local=tmp_path / "local")
    claim_rank(store.tiers.local, 0, 2)
    claim_rank(store.tiers.local, 0, 4)  # the same rank, a new world: fine
    assert json.loads((tmp_path / "local" / ".uploads" / "rank.json").read_text())["world"] == 4
    with pytest.raises(TierError, match="a local folder of its own"):
        claim_rank(store.tiers.local, 1, 4)
    store.close()
