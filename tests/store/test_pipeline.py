"""The one commit pipeline (prepare -> capture -> write -> publish) and its public surface.

Single-process, async and sharded commits land through one publish: the same errors whichever
path wrote the commit, and the distributed paths drive the committer through public names only.
"""

from __future__ import annotations

import errno
import os

import pytest
import torch

import ckptstore
from ckptstore.commit.committer import Committer
from ckptstore.dcp import StorageWriter
from ckptstore.format.layout import COMMITS, MARKER
from ckptstore.history.manifest import encode_marker
from ckptstore.commit.pending import PendingCommit
from ckptstore.policy import Policy
from ckptstore.dcp.shards import LocalTensor, commit_shards
from ckptstore.storage import LocalStorage

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


class _ManifestsFail(LocalStorage):
    """A local disk that is full when a manifest is written (``fail`` True)."""

    fail = False

    def put_if_absent(self, key: str, data: bytes) -> bool:
        if self.fail and key.startswith(f"{COMMITS}/"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path(key))
        return super().put_if_absent(key, data)


def _store(root: str) -> ckptstore.Store:
    storage = _ManifestsFail(root)
    storage.put_if_absent(MARKER, encode_marker())
    return ckptstore.Store(storage)


def _ranks(step: int) -> list[list[LocalTensor]]:
    full = torch.arange(64, dtype=torch.float32).reshape(16, 4) + step
    return [[LocalTensor("w", (0, 0), (16, 4), full[:8])],
            [LocalTensor("w", (8, 0), (16, 4), full[8:])]]


@pytest.mark.parametrize("path", ["commit", "commit_async", "sharded"])
def test_a_failed_manifest_write_says_what_is_left_on_every_path(tmp_path, path):
    """One publish: a sharded commit's coordinator reports a back-end fault as Store.commit
    does (the branch unchanged, free space) instead of a raw OSError."""
    store = _store(str(tmp_path / "s"))
    first = commit_shards(store, _ranks(0)).id
    store.storage.fail = True
    state = {"w": torch.ones(16, 4)}
    with pytest.raises(ckptstore.StorageFullError, match="free space") as err:
        if path == "commit":
            store.commit(state)
        elif path == "commit_async":
            store.commit_async(state).wait()
        else:
            commit_shards(store, _ranks(1))
    assert "nothing was made visible" in str(err.value) and first[:12] in str(err.value)
    assert store.resolve("main") == first
    store.storage.fail = False
    assert commit_shards(store, _ranks(2)).parent == first
    store.close()


def test_a_taken_tag_is_refused_before_anything_is_written_on_every_path(tmp_path):
    """One check that tags are free, before the commit id is drawn, for Store.commit and
    DCP's coordinator alike."""
    store = _store(str(tmp_path / "s"))
    store.commit({"w": torch.zeros(4)}, tags=["v1"])
    with pytest.raises(ckptstore.RefExists, match="already exists"):
        store.commit({"w": torch.ones(4)}, tags=["v1"])
    writer = StorageWriter(store, tags=["v1"])
    with pytest.raises(ckptstore.RefExists, match="already exists"):
        writer.prepare_global_plan([])
    assert writer.commit_id == ""
    store.close()


def test_the_committer_surface_the_distributed_paths_use(tmp_path):
    """Public names for what ckptstore.dcp.collective needs: the committer, the commit in flight,
    the async group, a pending commit's completion, the writer's tree, order and commit id."""
    store = ckptstore.open(str(tmp_path / "s"))
    committer = store.committer
    assert isinstance(committer, Committer) and committer.async_group is None
    info = store.commit({"w": torch.zeros(4)})
    pending = PendingCommit(0.0, 0)
    committer.inflight = pending
    assert not pending.join(0)
    pending.finish(info, None)  # the next commit waits for the one in flight: it has landed
    assert pending.join(0) and pending.wait() is info
    assert store.commit({"w": torch.zeros(4)}).parent == info.id
    tree = {"dict": [["w", {"tensor": 0}]]}
    writer = StorageWriter(store, tree=tree, order=["w"])
    torch.distributed.checkpoint.save({"w": torch.ones(4)}, storage_writer=writer, no_dist=True)
    assert store.manifest(writer.commit_id).tree == tree
    assert writer.last_commit.id == writer.commit_id == store.resolve("main")
    store.close()


def test_a_ranks_fork_remembers_its_chains_before_the_merge(tmp_path):
    """A rank's part (the pipeline's fork) remembers its chain bases right after its write: the
    coordinator alone knows when the ref moves."""
    from ckptstore.dcp.shards import write_part

    store = _store(str(tmp_path / "s"))
    committer = store.committer
    before = committer.chains.nbytes()
    table = torch.arange(4096 * 64, dtype=torch.float32).reshape(4096, 64)  # rows worth tracking
    half = [LocalTensor("w", (2048, 0), (4096, 64), table[2048:])]
    parts = write_part(committer, "0" * 20 + "019a0000abcd", 1, half,
                       Policy(incremental="consecutive"), "main", None)
    assert committer.chains.nbytes() != before  # the reference is kept, nothing published
    assert store.refs.tip("main") is None
    assert [p.entry.array[:3] for p in parts] == ["r1."]  # the rank's own arrays
    store.close()
