"""Sharded commits across real gloo ranks (spawned processes): DTensor row- and column-sharded
tables, a replicated MLP, FSDP2, ShardedTensor; resharding 2->1, 2->4, 4->2; S3; a rank killed
mid-commit; one rank restoring alone; per-rank policies and row trackers."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptstore
from ckptstore.dcp import StorageReader
from dist_ranks import (async_errors, check_ranks, die_while_writing, fsdp_commit_checkout,
                        fsdp_sensitivity_commit, fsdp_shrink_commits, load_tables,
                        offset_shards_async, one_rank_cannot_copy, one_rank_cannot_stage,
                        one_rank_recovers, parts_in_persist_process, policy_commits,
                        run_ranks, save_tables, sharded_tensor_round_trip, tables,
                        tracked_shards)

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def test_save_on_2_load_on_4_and_on_1(tmp_path):
    url = str(tmp_path / "store")
    check_ranks(run_ranks(save_tables, 2, tmp_path / "ranks", url, {}, "v1"))
    check_ranks(run_ranks(load_tables, 4, tmp_path / "ranks", url, {}, "v1"))
    with ckptstore.open(url, create=False) as store:  # 2 -> 1: one process, no group
        full = tables()
        sd = {"emb": {"user": torch.zeros(1030, 16), "item": torch.zeros(64, 24)},
              "mlp": {"weight": torch.zeros(16, 8), "bias": torch.zeros(8)}, "step": 0}
        dcp.load(sd, storage_reader=StorageReader(store, "v1"))
        assert torch.equal(sd["emb"]["user"], full["emb.user"]) and sd["step"] == 7
        assert torch.equal(sd["emb"]["item"], full["emb.item"])
        got = store.checkout("v1")
        assert torch.equal(got["emb"]["user"], full["emb.user"])
        assert torch.equal(got["mlp"]["weight"], full["mlp.weight"])
        m = store.manifest(store.resolve("v1"))
        assert m.format_version == 2 and {len(e.pieces or []) for e in m.tensors} == {0, 2}
        assert store.verify().problems == []


def test_save_on_4_load_on_2(tmp_path):
    url = str(tmp_path / "store")
    check_ranks(run_ranks(save_tables, 4, tmp_path / "ranks", url, {}, "v4"))
    check_ranks(run_ranks(load_tables, 2, tmp_path / "ranks", url, {}, "v4"))


def test_on_s3(tmp_path, s3_server):
    import uuid
    url = f"s3://ckpt-tests/{uuid.uuid4().hex}"
    check_ranks(run_ranks(save_tables, 2, tmp_path / "ranks", url, s3_server, "s3"))
    check_ranks(run_ranks(load_tables, 2, tmp_path / "ranks", url, s3_server, "s3"))


def test_fsdp2_collective_commit_and_local_checkout(tmp_path):
    check_ranks(run_ranks(fsdp_commit_checkout, 2, tmp_path / "ranks", str(tmp_path / "s"), {}))


@pytest.mark.parametrize("background", ["thread", "auto"])
def test_fsdp2_shrink_stores_residual_blocks_per_rank(tmp_path, background):
    """On the thread, and in the persist process from the first commit (``reserve``: a change
    of way in between would start the chains anew)."""
    check_ranks(run_ranks(fsdp_shrink_commits, 2, tmp_path / "ranks", str(tmp_path / "s"),
                          {"background": background}))


def test_fsdp2_sensitivity_ranks_each_rank_block(tmp_path):
    check_ranks(run_ranks(fsdp_sensitivity_commit, 2, tmp_path / "ranks", str(tmp_path / "s"),
                          {}))


def test_policies_per_rank(tmp_path):
    check_ranks(run_ranks(policy_commits, 2, tmp_path / "ranks", str(tmp_path / "s"), {}))


def test_a_rank_killed_mid_commit_leaves_the_ref_unchanged(tmp_path):
    url = tmp_path / "store"
    with ckptstore.open(url) as store:
        first = store.commit({"w": torch.ones(3)}).id
    results = run_ranks(die_while_writing, 2, tmp_path / "ranks", str(url), {})
    assert results[0] == "ok", results[0]  # the survivor saw the save fail
    assert results[1] == "exit 3"
    assert (tmp_path / "survivor.txt").read_text()
    with ckptstore.open(url, create=False) as store:
        assert store.resolve("main") == first and store.commit_ids() == [first]
        assert len(list((url / "data").iterdir())) == 2  # the dead commit's orphan chunks
        store.gc(grace_period=0)
        assert [p.name for p in (url / "data").iterdir()] == [first]
        assert store.verify().problems == []


def test_one_rank_restores_its_shard_alone(tmp_path):
    check_ranks(run_ranks(one_rank_recovers, 2, tmp_path / "ranks", str(tmp_path / "s"), {}))


def test_row_tracking_per_shard(tmp_path):
    check_ranks(run_ranks(tracked_shards, 2, tmp_path / "ranks", str(tmp_path / "s"), {}))


def test_collective_commit_async_raises_ckptstore_errors(tmp_path):
    check_ranks(run_ranks(async_errors, 2, tmp_path / "ranks", str(tmp_path / "s"), {}))


def test_sharded_tensor_saves_and_loads_as_dtensor(tmp_path):
    check_ranks(run_ranks(sharded_tensor_round_trip, 2, tmp_path / "ranks",
                          str(tmp_path / "s"), {}))


def test_collective_parts_persist_in_the_persist_process(tmp_path):
    check_ranks(run_ranks(parts_in_persist_process, 2, tmp_path / "ranks",
                          str(tmp_path / "s"), {}))


def test_a_rank_that_cannot_stage_fails_every_rank_at_once(tmp_path):
    check_ranks(run_ranks(one_rank_cannot_stage, 2, tmp_path / "ranks", str(tmp_path / "s"),
                          {}, timeout=120))


def test_a_rank_whose_staging_copy_fails_fails_every_rank_at_once(tmp_path):
    check_ranks(run_ranks(one_rank_cannot_copy, 2, tmp_path / "ranks", str(tmp_path / "s"),
                          {}, timeout=120))


@pytest.mark.parametrize("background", ["thread", "process"])
def test_commit_async_of_shards_past_their_storages_start(tmp_path, background):
    check_ranks(run_ranks(offset_shards_async, 2, tmp_path / "ranks", str(tmp_path / "s"),
                          {"background": background}))
