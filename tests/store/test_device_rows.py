"""Changed rows found on the device (issue 11, :mod:`ckptstore.device.rows`): an increment of a
tensor staged on its device is compared there with a reference kept there, and only the changed
rows cross to the host. CI has no GPU: ``device_encode="always"`` runs the same code on CPU
tensors, and every commit is compared byte for byte with the host path's (``"off"``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ckptstore
from ckptstore import EncodingOptions, Policy, QuantSpec
from ckptstore.device.rows import changed_rows_on_device
from ckptstore.errors import StorageError
from ckptstore.format.layout import data_dir
from ckptstore.commit.staging import StagingPool
from ckptstore.chains.replay import changed_rows, xor_bits

ROWS, DIM = 3000, 16


def _state(step: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    table = torch.randn(ROWS, DIM, generator=g)
    dense = torch.randn(64, 64, generator=g)
    for s in range(1, step + 1):  # each step moves some rows (and one NaN that stays a NaN)
        rows = torch.randperm(ROWS, generator=torch.Generator().manual_seed(s))[: 40 * s]
        table[rows] += 0.01 * s
        table[s, 3] = float("nan")
    return {"emb": table.to(dtype), "dense": dense + step}


def _chunks(store: ckptstore.Store, commit: str) -> dict[str, bytes]:
    """The commit's chunk files by path under its folder (zarr.json files left out)."""
    prefix = data_dir(commit)
    storage = store.repo.storage
    return {k[len(prefix):]: storage.read(k) for k in storage.walk_sizes(prefix)
            if not k.endswith("zarr.json")}


def _shadow_on_device(store: ckptstore.Store) -> bool:
    shadows = store._committer.chains._shadows
    return any(s.device_values is not None and s.values is None for s in shadows.values())


POLICIES = {
    "consecutive, lossless": Policy(incremental="consecutive", max_chain=3),
    "one-shot, lossless": Policy(incremental="one-shot", max_chain=4),
    "intermittent, 4-bit": Policy(incremental="intermittent", quantize=QuantSpec(bits=4)),
    "consecutive, 8-bit": Policy(incremental="consecutive", quantize=QuantSpec(bits=8)),
}


@pytest.mark.parametrize("name", list(POLICIES))
@pytest.mark.parametrize("asynchronous", [False, True], ids=["commit", "commit_async"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_commits_equal_the_host_path(tmp_path, name, asynchronous, dtype):
    policy = POLICIES[name]
    stores = {mode: ckptstore.open(tmp_path / mode, options=EncodingOptions(
        device_encode=mode, pack_below=1024), policy=policy) for mode in ("off", "always")}
    commits: dict[str, list[str]] = {mode: [] for mode in stores}
    for step in range(6):
        state = _state(step, dtype)
        for mode, store in stores.items():
            info = (store.commit_async(state).wait() if asynchronous
                    else store.commit(state))
            commits[mode].append(info.id)
    assert _shadow_on_device(stores["always"]) and not _shadow_on_device(stores["off"])
    for host, dev in zip(commits["off"], commits["always"]):
        mh, md = (stores[m].manifest(c) for m, c in (("off", host), ("always", dev)))
        assert [(e.path, e.kind, e.fractions, e.chain) for e in mh.tensors] == [
            (e.path, e.kind, e.fractions, e.chain) for e in md.tensors]
        assert _chunks(stores["off"], host) == _chunks(stores["always"], dev)
        got = stores["always"].checkout(dev)["emb"]
        want = stores["off"].checkout(host)["emb"]
        assert torch.equal(got.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                           want.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))
    kinds = {e.kind for c in commits["always"] for e in stores["always"].manifest(c).tensors
             if e.path == "emb"}
    assert len(kinds) > 1  # the chain was used, not only full commits
    for store in stores.values():
        store.close()


def test_a_failed_commit_leaves_the_device_reference(tmp_path, monkeypatch):
    """The reference moves only when the branch does: after a commit that failed, the next one
    is compared with the last one that landed and restores exactly."""
    store = ckptstore.open(tmp_path / "s", options=EncodingOptions(device_encode="always",
                                                                    pack_below=1024),
                           policy=Policy(incremental="consecutive", max_chain=5))
    store.commit(_state(0))
    store.commit(_state(1))
    real = type(store.repo.storage).put_chunk

    def broken(self, key, data):
        raise OSError("disk on fire")

    monkeypatch.setattr(type(store.repo.storage), "put_chunk", broken)
    with pytest.raises(StorageError):
        store.commit(_state(2))
    monkeypatch.setattr(type(store.repo.storage), "put_chunk", real)
    info = store.commit(_state(3))
    assert store.manifest(info.id).tensors[0].kind.value == "consecutive"
    got = store.checkout(info.id)["emb"]
    assert torch.equal(got.view(torch.int32), _state(3)["emb"].view(torch.int32))
    store.close()


def test_no_room_on_the_device_compares_on_the_host(tmp_path, monkeypatch):
    """An increment the device has no room to stage is staged on the host and compared with a
    host copy of the device reference: the same bytes; the next reference then lives on the
    host."""
    opts = EncodingOptions(device_encode="always", pack_below=1024)
    policy = Policy(incremental="consecutive", max_chain=5)
    dev = ckptstore.open(tmp_path / "d", options=opts, policy=policy)
    host = ckptstore.open(tmp_path / "h", options=EncodingOptions(device_encode="off",
                                                                  pack_below=1024), policy=policy)
    ids = [(host.commit_async(_state(0)).wait().id, dev.commit_async(_state(0)).wait().id)]
    assert _shadow_on_device(dev)
    monkeypatch.setattr(StagingPool, "stage_device", lambda *a, **k: None)
    for step in (1, 2):
        ids.append((host.commit_async(_state(step)).wait().id,
                    dev.commit_async(_state(step)).wait().id))
    assert not _shadow_on_device(dev)
    for h, d in ids:
        assert _chunks(host, h) == _chunks(dev, d)
    dev.close()
    host.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64])
@pytest.mark.parametrize("xor", [False, True])
def test_rows_and_values_equal_the_host_kernels(dtype, xor):
    rng = np.random.default_rng(4)
    ref = torch.from_numpy(rng.standard_normal((500, 7))).to(dtype)
    cur = ref.clone()
    touched = rng.choice(500, 60, replace=False)
    cur[touched] = torch.from_numpy(rng.standard_normal((60, 7))).to(dtype)
    if dtype.is_floating_point:
        cur[touched[0], 2] = ref[touched[0], 2] = float("nan")  # equal NaNs: not a change
        cur[touched[1], 0] = -0.0 if ref[touched[1], 0] == 0 else cur[touched[1], 0]
    rows, values = changed_rows_on_device(cur, ref, xor)
    c, r = ((t.view(torch.uint16) if dtype == torch.bfloat16 else t).numpy() for t in (cur, ref))
    want_rows = changed_rows(c, r)
    np.testing.assert_array_equal(rows, want_rows)
    want = xor_bits(c[want_rows], r[want_rows]) if xor else c[want_rows]
    assert values.dtype == want.dtype and values.tobytes() == want.tobytes()
    empty_rows, empty = changed_rows_on_device(ref, ref.clone(), xor)
    assert empty_rows.size == 0 and empty.shape == (0, 7)


def test_no_room_for_the_next_reference_takes_a_full_baseline(tmp_path, monkeypatch):
    """When the device has no room to keep the next reference, an increment's snapshot (its
    changed rows only) cannot become one on the host: the store forgets the chain, and the
    next commit is a full baseline -- never an increment against a reference it lacks."""
    import ckptstore.device.rows as memory  # the rows kind imports it when it keeps one

    store = ckptstore.open(tmp_path / "s", options=EncodingOptions(device_encode="always",
                                                                    pack_below=1024),
                           policy=Policy(incremental="consecutive", max_chain=5))
    store.commit(_state(0))
    store.commit(_state(1))
    monkeypatch.setattr(memory, "device_reference", lambda t, into=None: None)
    kinds = []
    for step in (2, 3, 4):
        info = store.commit(_state(step))
        kinds.append(store.manifest(info.id).tensors[0].kind.value)
        got = store.checkout(info.id)["emb"]
        assert torch.equal(got.view(torch.int32), _state(step)["emb"].view(torch.int32))
    # 2: an increment (the reference of 1 was kept), then no reference: full; a full commit's
    # snapshot is the whole table, which becomes the reference on the host: an increment again
    assert kinds == ["consecutive", "full", "consecutive"]
    store.close()


@pytest.mark.parametrize("mode", ["off", "always"])
def test_the_next_reference_reuses_the_old_ones_memory(tmp_path, mode):
    """A consecutive chain's reference is rewritten in place commit after commit (no fresh
    table-sized buffer a commit), on the host and on the device alike."""
    store = ckptstore.open(tmp_path / "s", options=EncodingOptions(device_encode=mode,
                                                                    pack_below=1024),
                           policy=Policy(incremental="consecutive", max_chain=10))
    buffers = set()
    for step in range(4):
        store.commit(_state(step))
        shadow = store._committer.chains._shadows[("main", "emb")]
        ref = shadow.device_values if mode == "always" else shadow.values
        buffers.add(ref.data_ptr() if mode == "always" else ref.ctypes.data)
        np.testing.assert_array_equal(np.asarray(ref).view(np.uint32),
                                      _state(step)["emb"].numpy().view(np.uint32))
    assert len(buffers) == 1
    table = ROWS * DIM * 4
    assert store.reference_bytes == ((0, table) if mode == "always" else (table, 0))
    store.close()


def test_sharded_commits_compare_each_ranks_blocks_on_the_device(tmp_path):
    """Each rank's blocks of a sharded commit (``ckptstore.dcp.shards``) are compared on their
    device as one process's tensors are: the same stored bytes as the host path."""
    from ckptstore.dcp.shards import LocalTensor, commit_shards

    def shards(step: int) -> list[list[LocalTensor]]:
        table = _state(step)["emb"]
        half = ROWS // 2
        return [[LocalTensor("emb", (r * half, 0), (ROWS, DIM), table[r * half:(r + 1) * half])]
                for r in range(2)]

    policy = Policy(incremental="consecutive", max_chain=5)
    stores = {mode: ckptstore.open(tmp_path / mode, options=EncodingOptions(
        device_encode=mode, pack_below=1024), policy=policy) for mode in ("off", "always")}
    ids = {mode: [commit_shards(s, shards(step), policy=policy).id for step in range(4)]
           for mode, s in stores.items()}
    assert _shadow_on_device(stores["always"]) and not _shadow_on_device(stores["off"])
    for h, d in zip(ids["off"], ids["always"]):
        assert _chunks(stores["off"], h) == _chunks(stores["always"], d)
        kinds = {e.kind.value for e in stores["always"].manifest(d).shards}
        got = stores["always"].checkout(d)["emb"]
        assert torch.equal(got.view(torch.int32), stores["off"].checkout(h)["emb"].view(
            torch.int32))
    assert kinds == {"consecutive"}
    for s in stores.values():
        s.close()


def test_out_of_device_memory_compares_on_the_host(tmp_path, monkeypatch):
    """A device that runs out of memory mid-compare: the table comes over whole and is compared
    on the host with a host copy of the reference -- the same bytes, the next reference still
    on the device."""
    import ckptstore.commit.snapshot as snapshot_module

    def oom(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("no room")

    policy = Policy(incremental="consecutive", max_chain=5)
    stores = {mode: ckptstore.open(tmp_path / mode, options=EncodingOptions(
        device_encode=mode, pack_below=1024), policy=policy) for mode in ("off", "always")}
    ids: dict[str, list[str]] = {m: [s.commit_async(_state(0)).wait().id] for m, s in
                                 stores.items()}
    monkeypatch.setattr(snapshot_module, "changed_rows_on_device", oom)
    for step in (1, 2):
        for mode, s in stores.items():
            ids[mode].append(s.commit_async(_state(step)).wait().id)
    assert _shadow_on_device(stores["always"])
    for h, d in zip(ids["off"], ids["always"]):
        assert _chunks(stores["off"], h) == _chunks(stores["always"], d)
    assert stores["always"].manifest(ids["always"][-1]).tensors[0].kind.value == "consecutive"
    for s in stores.values():
        s.close()


def test_complex_tables_are_compared_on_the_host(tmp_path):
    """Items of 16 bytes have no integer view on the device: complex128 increments keep their
    reference on the host, under ``device_encode="always"`` too."""
    store = ckptstore.open(tmp_path / "s", options=EncodingOptions(device_encode="always",
                                                                    pack_below=1024),
                           policy=Policy(incremental="consecutive", max_chain=5))
    for step in range(3):
        table = _state(step)["emb"].to(torch.complex128) * (1 + 1j)
        info = store.commit({"emb": table})
        got = store.checkout(info.id)["emb"]
        assert torch.equal(torch.view_as_real(got).view(torch.int64),
                           torch.view_as_real(table).view(torch.int64))
    assert store.manifest(info.id).tensors[0].kind.value == "consecutive"
    assert not _shadow_on_device(store)
    store.close()
