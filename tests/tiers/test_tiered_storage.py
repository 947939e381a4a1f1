"""TieredStorage: writes to the local tier, reads local first with the remote behind."""

from __future__ import annotations

import pytest

from ckptstore.storage import open_storage
from ckptstore.tiers import TieredStorage

C1, C2 = "a" * 20 + "0" * 12, "b" * 20 + "0" * 12


@pytest.fixture
def tiers(tmp_path):
    local, remote = open_storage(tmp_path / "local"), open_storage(tmp_path / "remote")
    return local, remote, TieredStorage(local, remote)


def test_writes_go_to_the_local_tier_only(tiers):
    local, remote, both = tiers
    both.put("x", b"1")
    both.put_chunk("data/c/0", [b"ab", b"c"])
    assert both.put_if_absent("refs/tags/t", b"id")
    assert local.read("data/c/0") == b"abc" and not remote.exists("x")
    remote.put("y", b"remote")
    both.delete("y")
    both.delete_tree("data")
    assert remote.read("y") == b"remote" and not local.exists("data/c/0")


def test_reads_fall_back_to_the_remote(tiers):
    local, remote, both = tiers
    remote.put(f"data/{C2}/w/c/0", b"remote chunk")
    local.put("k", b"local")
    remote.put("k", b"other")
    assert both.read("k") == b"local"
    assert bytes(both.read_chunk(f"data/{C2}/w/c/0")) == b"remote chunk"
    buf = bytearray(12)
    assert both.read_chunk_into(f"data/{C2}/w/c/0", [memoryview(buf)]) == 12
    assert bytes(buf) == b"remote chunk" and both.size(f"data/{C2}/w/c/0") == 12
    with pytest.raises(FileNotFoundError):
        both.read("nowhere")


def test_a_commit_with_a_local_manifest_is_read_locally_only(tiers):
    local, remote, both = tiers
    local.put(f"commits/{C1}.msgpack", b"m")
    remote.put(f"data/{C1}/w/c/1", b"never asked")  # a chunk zarr did not write locally
    assert not both.exists(f"data/{C1}/w/c/1")
    with pytest.raises(FileNotFoundError):
        both.read_chunk(f"data/{C1}/w/c/1")


def test_listings(tiers):
    local, remote, both = tiers
    local.put(f"commits/{C1}.msgpack", b"m")
    remote.put(f"commits/{C2}.msgpack", b"m")
    local.put("refs/heads/main/000000000001", b"x")
    remote.put("refs/heads/main/000000000000", b"x")
    remote.put("refs/heads/exp/000000000000", b"x")
    remote.put(f"data/{C2}/zarr.json", b"{}")
    assert both.listdir("commits") == sorted([f"{C1}.msgpack", f"{C2}.msgpack"])
    assert both.listdir("refs/heads") == ["exp", "main"]
    assert both.listdir("refs/heads/main") == ["000000000001"]  # the local tier's moves
    assert both.listdir("refs/heads/exp") == ["000000000000"]  # a branch only remote
    assert both.walk_sizes(f"data/{C2}") == {f"data/{C2}/zarr.json": 2}
