"""The inspection library behind ``ckpt diff / du / export``: ``Store.diff``, ``Store.usage``,
``ckptstore.export.to_safetensors`` and ``Store.iter_tensors``, on real local stores."""

from __future__ import annotations

import doctest
import importlib
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import ckptstore
import ckptstore.export
from ckptstore import CorruptedChunkError, DiffResult, ExportResult, UsageReport
from ckptstore.maintenance.diff import max_abs_diff
from ckptstore.export import ExportError
from ckptstore.format.ids import new_commit_id
from ckptstore.format.layout import COMMITS, DATA, ZARR_JSON, array_dir, data_dir, manifest_key
from ckptstore.policy import Policy

safetensors_torch = pytest.importorskip("safetensors.torch")


def _sizes(store: ckptstore.Store, key: str) -> int:
    return sum(store.storage.walk_sizes(key).values())


# -- diff ------------------------------------------------------------------------------------------
def _two_commits(tmp_path: Path) -> ckptstore.Store:
    store = ckptstore.open(tmp_path / "s")
    w = torch.arange(100_000, dtype=torch.float32)  # its own array
    store.commit({"model": {"w": w, "nan": torch.tensor([1.0, math.nan, 3.0]),
                            "dtype": torch.ones(3), "shape": torch.zeros(2), "gone": torch.ones(1),
                            "same": torch.full((5,), 7.0)},
                  "lr": 0.1, "name": "sgd", "old": 1, "nanv": math.nan, "step": 1})
    w2 = w.clone()
    w2[17] += 2.5
    store.commit({"model": {"w": w2, "nan": torch.tensor([1.0, math.nan, 2.0]),
                            "dtype": torch.ones(3, dtype=torch.float64),
                            "shape": torch.zeros(3), "new": torch.ones(2, 2, dtype=torch.int8),
                            "same": torch.full((5,), 7.0)},
                  "lr": 0.05, "name": "sgd", "nanv": math.nan, "step": 1.0, "extra": b"x"})
    return store


def test_diff_of_changed_added_removed_tensors_and_values(tmp_path):
    with _two_commits(tmp_path) as store:
        d = store.diff("main~1", "main")
        assert isinstance(d, DiffResult) and d.differs
        assert (d.ref1, d.ref2) == (store.resolve("main~1"), store.resolve("main"))
        changed = {c.path: c for c in d.changed}
        assert list(changed) == ["model.w", "model.nan", "model.dtype", "model.shape"]
        assert changed["model.w"].max_abs_diff == 2.5
        assert changed["model.nan"].max_abs_diff == 1.0  # NaN facing NaN counts as equal
        assert changed["model.dtype"].max_abs_diff is None
        assert (changed["model.dtype"].old.dtype, changed["model.dtype"].new.dtype) == (
            "float32", "float64")
        assert (changed["model.shape"].old.shape, changed["model.shape"].new.shape) == ((2,), (3,))
        assert [(a.path, a.dtype, a.shape) for a in d.added] == [("model.new", "int8", (2, 2))]
        assert [r.path for r in d.removed] == ["model.gone"]
        assert d.unchanged == 1  # model.same
        # an int step that became a float is a change; NaN staying NaN is not
        assert {(v.path, v.old, v.new) for v in d.values_changed} == {("lr", 0.1, 0.05),
                                                                       ("step", 1, 1.0)}
        assert d.values_added == (("extra", b"x"),) and d.values_removed == (("old", 1),)
        doc = d.to_json()
        assert doc["changed"][0] == {"path": "model.w", "old": {"dtype": "float32",
                                                                 "shape": [100_000]},
                                     "new": {"dtype": "float32", "shape": [100_000]},
                                     "max_abs_diff": 2.5}
        assert doc["added"] == [{"path": "model.new", "dtype": "int8", "shape": [2, 2]}]
        assert doc["values_removed"] == [{"path": "old", "value": 1}]


def test_diff_paths_and_identical_commits(tmp_path):
    with _two_commits(tmp_path) as store:
        only = store.diff("main~1", "main", paths=["model.w", "lr"])
        assert [c.path for c in only.changed] == ["model.w"] and not only.added
        assert [v.path for v in only.values_changed] == ["lr"] and not only.values_added
        same = store.diff("main", "main")
        assert not same.differs and same.unchanged == 6 and same.changed == ()
        json.dumps(store.diff("main~1", "main~1").to_json())  # plain JSON without bytes values


def test_max_abs_diff_nan_bool_int_and_chunks():
    nan = float("nan")
    assert max_abs_diff(torch.tensor([nan, 1.0]), torch.tensor([nan, 1.5])) == 0.5
    assert math.isnan(max_abs_diff(torch.tensor([nan, 1.0]), torch.tensor([0.0, 1.0])))
    assert max_abs_diff(torch.tensor([True]), torch.tensor([False])) == 1.0
    assert max_abs_diff(torch.tensor([True]), torch.tensor([True])) == 0.0
    assert max_abs_diff(torch.tensor([100], dtype=torch.int8),
                        torch.tensor([-100], dtype=torch.int8)) == 200.0  # no int8 overflow
    a = torch.zeros(1000)
    b = a.clone()
    b[999] = -4.0
    assert max_abs_diff(a, b, step=7) == 4.0  # the largest is found in the last slice
    assert max_abs_diff(torch.ones(2, dtype=torch.complex64), torch.zeros(2)) == 1.0


# -- usage -----------------------------------------------------------------------------------------
def test_usage_of_chain_commits_against_a_listing(tmp_path):
    store = ckptstore.open(tmp_path / "chain", policy=Policy(incremental="consecutive",
                                                             min_rows=64))
    a, b = torch.zeros(2048, 16), torch.ones(2048, 16)
    for step in (1, 2, 3):
        a[step * 10] += step
        b[step] += step
        store.commit({"emb": {"a": a, "b": b}, "step": step})
    c3, c2, c1 = ids = [c.id for c in store.log()]
    if store.manifest(c3).tensors[0].layout != "chain":
        pytest.skip("the store wrote no chain entry for this policy")

    def arrays(c: str) -> int:  # every array of a commit: its folder less the group's zarr.json
        return _sizes(store, data_dir(c)) - store.storage.size(f"{data_dir(c)}/{ZARR_JSON}")

    report = store.usage()
    assert isinstance(report, UsageReport)
    rows = {r.id: r for r in report.commits}
    assert list(rows) == ids
    for c in ids:
        assert rows[c].own_bytes == _sizes(store, data_dir(c))
        assert rows[c].manifest_bytes == store.storage.size(manifest_key(c))
        assert rows[c].step == ids[::-1].index(c) + 1 and rows[c].error is None
    # both chain entries of c3 replay c2's parts onto c1's baseline arrays
    assert rows[c3].reads == tuple(sorted((c1, c2))) and rows[c3].shared_bytes == arrays(c1) + arrays(c2)
    assert rows[c2].reads == (c1,) and rows[c2].shared_bytes == arrays(c1)
    assert rows[c1].reads == () and rows[c1].total_bytes == rows[c1].own_bytes
    listing = store.storage.walk_sizes("")
    assert report.store_bytes == sum(listing.values())
    assert report.data_bytes == _sizes(store, DATA)  # each folder once, however often read
    assert report.manifest_bytes == _sizes(store, COMMITS)
    assert report.total_bytes == report.data_bytes + report.manifest_bytes
    assert rows[c3].refs == ("main",)

    two = store.usage("main", limit=2)  # c3 and c2 list; c1's arrays count once for both
    assert [r.id for r in two.commits] == [c3, c2] and two.store_bytes is None
    assert two.data_bytes == rows[c3].own_bytes + rows[c2].own_bytes + arrays(c1)
    assert two.leftover_data == ()
    store.close()


def test_usage_counts_leftover_data_and_its_json(tmp_path):
    with ckptstore.open(tmp_path / "s") as store:
        store.commit({"w": torch.ones(10)}, message="one")
        orphan = new_commit_id()
        store.storage.put(f"{array_dir(orphan, 'w')}/c/0", b"x" * 100)
        report = store.usage()
        assert report.leftover_data == ((orphan, 100),)
        assert report.data_bytes == report.commits[0].own_bytes  # leftovers are not kept data
        doc = report.to_json()
        assert doc["leftover_data"] == [{"id": orphan, "own_bytes": 100}]
        assert list(doc["commits"][0]) == ["id", "refs", "time", "step", "message", "own_bytes",
                                           "shared_bytes", "reads", "manifest_bytes",
                                           "total_bytes"]
        assert doc["commits"][0]["message"] == "one" and doc["total_bytes"] == (
            doc["data_bytes"] + doc["manifest_bytes"])


# -- export ----------------------------------------------------------------------------------------
def _export_state() -> dict:
    emb = torch.randn(300, 64)
    return {"model": {"emb": emb, "head": emb, "fc": torch.randn(8, 4).to(torch.bfloat16),
                      "np": np.arange(6, dtype=np.int16).reshape(2, 3)},
            "z": torch.ones(2, dtype=torch.complex128), "step": 3, "blob": b"\x00"}


def test_export_round_trip_read_back_with_safetensors(tmp_path):
    state = _export_state()
    with ckptstore.open(tmp_path / "s") as store:
        store.commit(state)
        out = tmp_path / "all.safetensors"
        result = ckptstore.export.to_safetensors(store, "main", out)
        assert isinstance(result, ExportResult) and result.commit == store.resolve("main")
        assert result.tensors == 4 and result.nbytes == out.stat().st_size
        assert sorted(s.split(" ")[0] for s in result.skipped) == ["blob", "z"]
        loaded = safetensors_torch.load_file(str(out))
        for k in ("emb", "head", "fc"):
            t = state["model"][k]
            assert loaded[f"model.{k}"].dtype == t.dtype
            assert torch.equal(loaded[f"model.{k}"].view(torch.uint8), t.view(torch.uint8))
        assert torch.equal(loaded["model.np"], torch.from_numpy(state["model"]["np"]))
        from safetensors import safe_open
        with safe_open(str(out), "pt") as f:
            meta = f.metadata()
        assert meta == {"format": "pt", "ckptstore.commit": result.commit, "step": "3"}
        assert list(result.metadata_keys) == sorted(meta)

        model = tmp_path / "model.safetensors"
        ckptstore.export.to_safetensors(store.repo, "main", model, paths=["model"],
                                        strip_prefix="model.")
        assert set(safetensors_torch.load_file(str(model))) == {"emb", "head", "fc", "np"}


def test_export_refuses_to_overwrite_or_clash_and_leaves_no_temporary_file(tmp_path):
    with ckptstore.open(tmp_path / "s") as store:
        store.commit({"a": {"w": torch.ones(2)}, "w": torch.zeros(2), "b": torch.ones(1)})
        out = tmp_path / "out" / "x.safetensors"
        with pytest.raises(ExportError, match="folder does not exist"):
            ckptstore.export.to_safetensors(store, "main", out)
        out.parent.mkdir()
        out.write_bytes(b"keep me")
        with pytest.raises(ExportError, match="overwrite=True"):
            ckptstore.export.to_safetensors(store, "main", out)
        assert out.read_bytes() == b"keep me"
        with pytest.raises(ExportError, match="same key 'w'"):
            ckptstore.export.to_safetensors(store, "main", out, overwrite=True,
                                            strip_prefix="a.", paths=["a", "w"])
        ckptstore.export.to_safetensors(store, "main", out, overwrite=True, strip_prefix="a.",
                                        paths=["a"])
        assert set(safetensors_torch.load_file(str(out))) == {"w"}
        assert [p.name for p in out.parent.iterdir()] == ["x.safetensors"]


# -- iter_tensors ----------------------------------------------------------------------------------
def test_iter_tensors_matches_checkout(tmp_path):
    state = _export_state()
    with ckptstore.open(tmp_path / "s") as store:
        store.commit(state)
        got = list(store.iter_tensors("main", batch_bytes=1))
        assert [p for p, _ in got] == ["model.emb", "model.head", "model.fc", "model.np", "z"]
        full = store.checkout("main")
        for path, value in got:
            a, b = path.split(".") if "." in path else (path, None)
            expected = full[a][b] if b else full[a]
            assert type(value) is type(expected)
            assert np.array_equal(np.asarray(value.view(torch.uint8) if torch.is_tensor(value)
                                             else value),
                                  np.asarray(expected.view(torch.uint8)
                                             if torch.is_tensor(expected) else expected))
        assert [p for p, _ in store.iter_tensors("main", paths=["model.f*", "z"])] == [
            "model.fc", "z"]


def test_iter_tensors_reads_one_batch_at_a_time(tmp_path):
    """With a missing array last in the state, small batches yield the tensors before it and
    only then fail; one batch of everything fails before yielding anything."""
    with ckptstore.open(tmp_path / "s") as store:
        info = store.commit({"a": torch.ones(40_000), "b": torch.ones(40_000) * 2,
                             "c": torch.ones(40_000) * 3})
        e = store.manifest(info.id).tensors[2]
        assert e.layout == "array"
        shutil.rmtree(Path(tmp_path / "s", array_dir(e.commit, e.array), "c"))
        batched = store.iter_tensors("main", batch_bytes=160_000)  # one tensor a batch
        assert [(p, float(t[0])) for p, t in (next(batched), next(batched))] == [("a", 1.0),
                                                                                  ("b", 2.0)]
        with pytest.raises(CorruptedChunkError):
            next(batched)
        whole = store.iter_tensors("main")
        with pytest.raises(CorruptedChunkError):
            next(whole)


# -- docstrings ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["ckptstore.state.leaves", "ckptstore.maintenance.diff", "ckptstore.export",
                                  "ckptstore.cli", "ckptstore.cli._output"])
def test_doctests(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
