"""The ``ckpt`` command line: every verb, its --json output, exit statuses and error messages.

Most tests call ``main(argv)`` in-process; one runs the installed ``ckpt`` console script.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

import ckptstore
from ckptstore.cli import main, parse_storage_options
from ckptstore.cli._output import human_size
from ckptstore.maintenance.diff import max_abs_diff
from ckptstore.format.ids import new_commit_id
from ckptstore.format.layout import array_dir, data_dir

safetensors_torch = pytest.importorskip("safetensors.torch")


def _state(step: int) -> dict:
    """A small training state; values are exact in float32/bfloat16 so diffs are exact too."""
    emb = torch.arange(160 * 128, dtype=torch.float32).reshape(160, 128) / 4  # 80 KiB: own array
    fc = torch.ones(8, 4, dtype=torch.bfloat16)
    bias = torch.full((4,), 0.5)
    model = {"emb": emb, "fc": fc, "bias": bias}
    if step >= 2:
        emb[3, 5] += 0.25
        fc[1, 2] = 1.5
    if step >= 3:
        del model["bias"]
        model["extra"] = torch.zeros(2, 3, dtype=torch.int64)
    model["head"] = emb  # tied weights: stored once, exported twice
    return {"model": model, "optimizer": {"lr": 0.1 / step, "name": "sgd"}, "step": step}


@pytest.fixture
def ckpts(tmp_path):
    """A local store with three commits on main (steps 1, 2, 3); step 1 is tagged ``first``."""
    url = str(tmp_path / "ckpts")
    with ckptstore.open(url) as store:
        for step in (1, 2, 3):
            store.commit(_state(step), message=f"step {step}",
                         tags=["first"] if step == 1 else ())
    return url


def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def run_json(capsys, *argv: str):
    rc, out, err = run(capsys, *argv, "--json")
    assert rc == 0, err
    return json.loads(out)


def ids(url: str) -> list[str]:
    with ckptstore.open(url, create=False) as store:
        return [c.id for c in store.log("main")]


def files(url: str) -> dict[str, int]:
    return {str(p.relative_to(url)): p.stat().st_size for p in Path(url).rglob("*") if p.is_file()}


# -- general ---------------------------------------------------------------------------------------
def test_version_and_help(capsys):
    rc, out, _ = run(capsys, "--version")
    assert rc == 0 and ckptstore.__version__ in out
    rc, out, _ = run(capsys, "--help")
    assert rc == 0
    for verb in ("log", "show", "tag", "branch", "gc", "verify", "du", "diff", "export"):
        assert verb in out
    rc, out, _ = run(capsys, "gc", "--help")
    assert rc == 0 and "--keep-last" in out and "--storage-option" in out


def test_usage_error_exits_2(capsys):
    rc, out, err = run(capsys, "show")
    assert rc == 2 and out == "" and "STORE_URL" in err
    rc, _, err = run(capsys, "frobnicate", "x")
    assert rc == 2 and "invalid choice" in err


def test_missing_store_is_an_error_and_creates_nothing(capsys, tmp_path):
    where = tmp_path / "typo"
    rc, out, err = run(capsys, "log", where)
    assert rc == 3 and out == ""
    assert err.startswith("ckpt: error: ") and "no ckptstore" in err and "Traceback" not in err
    assert not where.exists()


def test_unknown_ref_exits_3_with_a_clear_message(capsys, ckpts):
    for argv in (("show", ckpts, "nope"), ("diff", ckpts, "main", "nope"),
                 ("log", ckpts, "--ref", "nope"), ("show", ckpts, "main~7")):
        rc, out, err = run(capsys, *argv)
        assert rc == 3, argv
        assert out == ""
        assert len(err.strip().splitlines()) == 1 and err.startswith("ckpt: error: ")
    rc, _, err = run(capsys, "show", ckpts, "nope")
    assert "no branch, tag or commit 'nope'" in err and "main" in err


def test_human_size():
    assert human_size(0) == "0 B"
    assert human_size(1023) == "1023 B"
    assert human_size(1536) == "1.5 KiB"
    assert human_size(5 * 2**20) == "5.0 MiB"
    assert human_size(3 * 2**30) == "3.0 GiB"


def test_parse_storage_options():
    opts = parse_storage_options(["key=abc", "anon=false", "client_kwargs.endpoint_url=http://h:1",
                                  "client_kwargs.region_name=eu", "timeout=2.5", 'tags=["a"]'])
    assert opts == {"key": "abc", "anon": False, "timeout": 2.5, "tags": ["a"],
                    "client_kwargs": {"endpoint_url": "http://h:1", "region_name": "eu"}}


@pytest.mark.parametrize("bad", ["novalue", "=x", "a..b=1"])
def test_bad_storage_option_exits_2(capsys, ckpts, bad):
    rc, out, err = run(capsys, "log", ckpts, "--storage-option", bad)
    assert rc == 2 and out == "" and "--storage-option" in err


# -- log / show ------------------------------------------------------------------------------------
def test_log_table(capsys, ckpts):
    rc, out, _ = run(capsys, "log", ckpts)
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].split() == ["COMMIT", "TIME", "(UTC)", "STEP", "STORED", "MESSAGE"]
    assert [line.split()[0] for line in lines[1:]] == [c[:10] for c in ids(ckpts)]
    assert "(main) step 3" in lines[1] and "(tag: first) step 1" in lines[3]
    assert "KiB" in lines[1]


def test_log_json_limit_and_ref(capsys, ckpts):
    log = run_json(capsys, "log", ckpts)
    assert [c["id"] for c in log] == ids(ckpts)
    assert [c["metadata"]["step"] for c in log] == [3, 2, 1]
    assert log[0]["refs"] == ["main"] and log[2]["refs"] == ["tag: first"]
    assert log[0]["parent"] == log[1]["id"] and log[2]["parent"] is None
    assert all(c["stored_bytes"] > 0 and c["message"] == f"step {c['metadata']['step']}"
               for c in log)
    assert [c["metadata"]["step"] for c in run_json(capsys, "log", ckpts, "--limit", "2")] == [3, 2]
    assert [c["metadata"]["step"] for c in run_json(capsys, "log", ckpts, "--ref", "main~1")] == [
        2, 1]


def test_log_of_an_empty_store(capsys, tmp_path):
    ckptstore.open(tmp_path / "empty").close()
    assert run_json(capsys, "log", tmp_path / "empty") == []
    rc, out, _ = run(capsys, "log", tmp_path / "empty")
    assert rc == 0 and "no commits" in out


def test_show_table(capsys, ckpts):
    rc, out, _ = run(capsys, "show", ckpts, "main~1")
    assert rc == 0
    assert f"commit   {ids(ckpts)[1]}" in out and f"parent   {ids(ckpts)[2]}" in out
    assert "message  step 2" in out and "step     2" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("model.")}
    assert set(rows) == {"model.emb", "model.fc", "model.bias", "model.head"}
    assert rows["model.emb"].split()[1:5] == ["float32", "[160,", "128]", "array"]
    assert "KiB" in rows["model.emb"]
    assert "bfloat16" in rows["model.fc"] and "packed" in rows["model.fc"]
    assert "alias" in rows["model.head"] and "model.emb" in rows["model.head"]
    assert "optimizer.lr" in out and "'sgd'" in out


def test_options_may_come_before_optional_positionals(capsys, ckpts):
    rc, out, _ = run(capsys, "show", ckpts, "--json", "first")
    assert rc == 0 and json.loads(out)["id"] == ids(ckpts)[2]
    rc, out, _ = run(capsys, "verify", ckpts, "--json", "--no-progress", "main")
    assert rc == 0 and json.loads(out)["commits_checked"] == 1


def test_show_json(capsys, ckpts):
    doc = run_json(capsys, "show", ckpts, "first")
    assert doc["id"] == ids(ckpts)[2] and doc["refs"] == ["tag: first"]
    assert doc["metadata"] == {"step": 1} and doc["message"] == "step 1"
    tensors = {t["path"]: t for t in doc["tensors"]}
    assert tensors["model.emb"]["shape"] == [160, 128]
    assert tensors["model.emb"]["layout"] == "array"
    with ckptstore.open(ckpts, create=False) as store:
        e = next(t for t in store.manifest(doc["id"]).tensors if t.path == "model.emb")
        on_disk = sum(store.storage.walk_sizes(array_dir(e.commit, e.array)).values())
    assert tensors["model.emb"]["stored_bytes"] == on_disk
    assert tensors["model.fc"]["dtype"] == "bfloat16" and tensors["model.fc"]["layout"] == "packed"
    assert tensors["model.head"]["layout"] == "alias"
    assert doc["values"] == {"optimizer.lr": 0.1, "optimizer.name": "sgd", "step": 1}
    only = run_json(capsys, "show", ckpts, "first", "--paths", "model.f*")
    assert [t["path"] for t in only["tensors"]] == ["model.fc"]


# -- tag / branch ----------------------------------------------------------------------------------
def test_tag_create_list_delete(capsys, ckpts):
    rc, out, _ = run(capsys, "tag", ckpts, "best", "main~1")
    assert rc == 0 and f"tagged {ids(ckpts)[1][:10]} as best" in out
    tags = {t["name"]: t for t in run_json(capsys, "tag", ckpts)}
    assert set(tags) == {"best", "first"}
    assert tags["best"]["id"] == ids(ckpts)[1] and tags["best"]["step"] == 2
    rc, out, _ = run(capsys, "tag", ckpts)
    assert rc == 0 and "best" in out and "first" in out and "NAME" in out

    rc, _, err = run(capsys, "tag", ckpts, "best")
    assert rc == 2 and "already exists" in err

    assert run_json(capsys, "tag", ckpts, "--delete", "best") == {"deleted": "best",
                                                                  "id": ids(ckpts)[1]}
    assert [t["name"] for t in run_json(capsys, "tag", ckpts)] == ["first"]
    rc, _, err = run(capsys, "tag", ckpts, "--delete", "best")
    assert rc == 3 and "no tag 'best'" in err


def test_branch_create_list_move_delete(capsys, ckpts):
    first, second, third = ids(ckpts)[::-1]
    assert run_json(capsys, "branch", ckpts, "exp", "first") == {
        "branch": "exp", "id": first, "action": "created"}
    tips = {b["name"]: b["id"] for b in run_json(capsys, "branch", ckpts)}
    assert tips == {"main": third, "exp": first}
    rc, _, err = run(capsys, "branch", ckpts, "exp", "main")
    assert rc == 2 and "already exists" in err
    rc, out, _ = run(capsys, "branch", ckpts, "exp", "main~1", "--force")
    assert rc == 0 and f"moved branch exp to {second[:10]}" in out
    rc, out, _ = run(capsys, "branch", ckpts)
    assert rc == 0 and "exp" in out and second[:10] in out
    rc, _, err = run(capsys, "branch", ckpts, "bad/name")
    assert rc == 3 and "invalid branch name" in err
    rc, out, _ = run(capsys, "branch", ckpts, "--delete", "exp")
    assert rc == 0 and "deleted branch exp" in out
    assert [b["name"] for b in run_json(capsys, "branch", ckpts)] == ["main"]


# -- gc --------------------------------------------------------------------------------------------
def test_gc_dry_run_removes_nothing(capsys, ckpts):
    before = files(ckpts)
    doc = run_json(capsys, "gc", ckpts, "--keep-last", "1", "--no-keep-tags", "--dry-run")
    assert doc["dry_run"] is True
    assert sorted(doc["commits_removed"]) == sorted(ids(ckpts)[1:])
    assert doc["tags_removed"] == ["first"] and doc["bytes_freed"] > 0
    rc, out, _ = run(capsys, "gc", ckpts, "--keep-last", "1", "--no-keep-tags", "--dry-run")
    assert rc == 0 and "would remove commit" in out and "nothing was removed" in out
    assert files(ckpts) == before


def test_gc_removes_and_reports_bytes_freed(capsys, ckpts):
    old = ids(ckpts)
    rc, out, _ = run(capsys, "gc", ckpts, "--keep-last", "1")  # the tag keeps step 1
    assert rc == 0
    assert f"removed commit {old[1]}" in out and "freed" in out and "KiB" in out
    assert run_json(capsys, "tag", ckpts)[0]["id"] == old[2]
    doc = run_json(capsys, "gc", ckpts, "--keep-last", "1", "--no-keep-tags", "--grace", "0")
    assert doc["commits_removed"] == [old[2]] and doc["tags_removed"] == ["first"]
    assert doc["bytes_freed"] > 0
    assert [c["id"] for c in run_json(capsys, "log", ckpts)] == [old[0]]


# -- verify ----------------------------------------------------------------------------------------
def test_verify_ok(capsys, ckpts):
    rc, out, _ = run(capsys, "verify", ckpts)
    assert rc == 0 and out.startswith("ok: checked 3 commits")
    doc = run_json(capsys, "verify", ckpts, "main")
    assert doc["ok"] is True and doc["commits_checked"] == 1 and doc["chunks_checked"] >= 2


def test_verify_names_a_corrupted_chunk(capsys, ckpts):
    with ckptstore.open(ckpts, create=False) as store:
        m = store.manifest(store.resolve("main~1"))
        e = next(t for t in m.tensors if t.path == "model.emb")
        chunk = next(k for k in store.storage.walk_sizes(array_dir(e.commit, e.array))
                     if "/c/" in k)
    path = Path(ckpts, chunk)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))

    rc, out, _ = run(capsys, "verify", ckpts)
    assert rc == 1
    assert chunk in out and "1 problem in" in out
    rc, out, err = run(capsys, "verify", ckpts, "main~1", "--json", "--progress")
    assert rc == 1
    doc = json.loads(out)  # the progress bar went to stderr, stdout is only JSON
    assert doc["ok"] is False and len(doc["problems"]) == 1 and doc["problems"][0].startswith(chunk)
    assert "verify" in err
    assert run(capsys, "verify", ckpts, "main")[0] == 0  # the other commits are intact


# -- du --------------------------------------------------------------------------------------------
def test_du(capsys, ckpts):
    doc = run_json(capsys, "du", ckpts)
    rows = {r["id"]: r for r in doc["commits"]}
    assert list(rows) == ids(ckpts)
    with ckptstore.open(ckpts, create=False) as store:
        for c, r in rows.items():
            assert r["own_bytes"] == sum(store.storage.walk_sizes(data_dir(c)).values())
            assert r["shared_bytes"] == 0 and r["total_bytes"] == r["own_bytes"]
    assert doc["data_bytes"] == sum(r["own_bytes"] for r in rows.values())
    assert doc["total_bytes"] == doc["data_bytes"] + doc["manifest_bytes"]
    assert doc["store_bytes"] == sum(files(ckpts).values())
    assert doc["leftover_data"] == []
    rc, out, _ = run(capsys, "du", ckpts)
    assert rc == 0 and "OWN" in out and "SHARED" in out and "total:" in out and "store:" in out
    leftover = Path(ckpts, array_dir(new_commit_id(), "w"), "c", "0")  # as a crash leaves
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(b"x" * 100)
    doc = run_json(capsys, "du", ckpts)
    assert doc["leftover_data"] == [{"id": leftover.parts[-4], "own_bytes": 100}]
    assert "leftover data" in run(capsys, "du", ckpts)[1]
    one = run_json(capsys, "du", ckpts, "--ref", "first")
    assert [r["id"] for r in one["commits"]] == [ids(ckpts)[2]] and one["store_bytes"] is None


# -- diff ------------------------------------------------------------------------------------------
def test_diff_reports_changed_tensors_and_max_abs_diff(capsys, ckpts):
    doc = run_json(capsys, "diff", ckpts, "first", "main~1")
    changed = {c["path"]: c["max_abs_diff"] for c in doc["changed"]}
    assert changed == {"model.emb": 0.25, "model.fc": 0.5, "model.head": 0.25}
    assert doc["unchanged"] == 1 and doc["added"] == [] and doc["removed"] == []
    assert {v["path"]: (v["old"], v["new"]) for v in doc["values_changed"]} == {
        "optimizer.lr": (0.1, 0.05), "step": (1, 2)}

    doc = run_json(capsys, "diff", ckpts, "main~1", "main")
    assert doc["changed"] == []
    assert doc["added"] == [{"path": "model.extra", "dtype": "int64", "shape": [2, 3]}]
    assert doc["removed"] == [{"path": "model.bias", "dtype": "float32", "shape": [4]}]

    rc, out, _ = run(capsys, "diff", ckpts, "first", "main~1")
    assert rc == 0
    row = next(line for line in out.splitlines() if "model.fc" in line)
    assert row.split()[0] == "changed" and "bfloat16" in row and row.split()[-1] == "0.5"
    assert "3 tensors changed" in out


def test_diff_exit_code_and_paths(capsys, ckpts):
    assert run(capsys, "diff", ckpts, "main", "main", "--exit-code")[0] == 0
    assert run(capsys, "diff", ckpts, "first", "main", "--exit-code")[0] == 1
    doc = run_json(capsys, "diff", ckpts, "first", "main~1", "--paths", "model.fc")
    assert [c["path"] for c in doc["changed"]] == ["model.fc"] and doc["values_changed"] == []


def test_diff_of_a_dtype_change_and_progress_on_stderr(capsys, tmp_path):
    url = tmp_path / "s"
    with ckptstore.open(url) as store:
        store.commit({"a": torch.ones(2), "b": torch.zeros(3), "c": torch.ones(70_000)})
        store.commit({"a": torch.ones(2, dtype=torch.float64), "b": torch.zeros(4),
                      "c": torch.ones(70_000) * 2})
    rc, out, err = run(capsys, "diff", url, "main~1", "main", "--json", "--progress")
    assert rc == 0
    doc = json.loads(out)
    assert doc["changed"] == [
        {"path": "a", "old": {"dtype": "float32", "shape": [2]},
         "new": {"dtype": "float64", "shape": [2]}, "max_abs_diff": None},
        {"path": "b", "old": {"dtype": "float32", "shape": [3]},
         "new": {"dtype": "float32", "shape": [4]}, "max_abs_diff": None},
        {"path": "c", "old": {"dtype": "float32", "shape": [70000]},
         "new": {"dtype": "float32", "shape": [70000]}, "max_abs_diff": 1.0}]
    assert "diff" in err  # the progress bar
    rc, out, _ = run(capsys, "diff", url, "main~1", "main")
    assert "float32 [3] -> float32 [4]" in out


def test_max_abs_diff_handles_nan_and_dtypes():
    a = torch.tensor([1.0, float("nan"), 3.0])
    assert max_abs_diff(a, torch.tensor([1.0, float("nan"), 2.5])) == 0.5
    assert max_abs_diff(torch.tensor([True, False]), torch.tensor([True, True])) == 1.0
    assert max_abs_diff(torch.tensor([5], dtype=torch.int8), torch.tensor([-3], dtype=torch.int8)
                        ) == 8.0
    x = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    assert max_abs_diff(x, x + 1) == 1.0


# -- export ----------------------------------------------------------------------------------------
def test_export_is_a_bit_exact_safetensors_file(capsys, ckpts, tmp_path):
    out_file = tmp_path / "main1.safetensors"
    doc = run_json(capsys, "export", ckpts, "main~1", out_file)
    assert doc["tensors"] == 4 and doc["bytes"] == out_file.stat().st_size
    loaded = safetensors_torch.load_file(str(out_file))
    expected = _state(2)["model"]
    assert set(loaded) == {f"model.{k}" for k in expected}
    for k, t in expected.items():
        got = loaded[f"model.{k}"]
        assert got.dtype == t.dtype and got.shape == t.shape
        assert torch.equal(got.view(torch.uint8), t.contiguous().view(torch.uint8)), k
    assert loaded["model.fc"].dtype == torch.bfloat16
    from safetensors import safe_open
    with safe_open(str(out_file), "pt") as f:
        meta = f.metadata()
    assert meta["format"] == "pt" and meta["ckptstore.commit"] == ids(ckpts)[1]
    assert json.loads(meta["step"]) == 2 and json.loads(meta["optimizer.name"]) == "sgd"


def test_export_paths_strip_prefix_and_overwrite(capsys, ckpts, tmp_path):
    out_file = tmp_path / "model.safetensors"
    rc, out, _ = run(capsys, "export", ckpts, "main", out_file, "--paths", "model",
                     "--strip-prefix", "model.")
    assert rc == 0 and "wrote" in out and "4 tensors" in out
    loaded = safetensors_torch.load_file(str(out_file))
    assert set(loaded) == {"emb", "fc", "extra", "head"}
    assert torch.equal(loaded["extra"], torch.zeros(2, 3, dtype=torch.int64))

    rc, _, err = run(capsys, "export", ckpts, "first", out_file)
    assert rc == 2 and "--force" in err
    assert set(safetensors_torch.load_file(str(out_file))) == {"emb", "fc", "extra", "head"}
    assert run(capsys, "export", ckpts, "first", out_file, "--force")[0] == 0
    assert "model.bias" in safetensors_torch.load_file(str(out_file))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpts", "model.safetensors"]


def test_export_numpy_leaves_and_unsupported_dtypes(capsys, tmp_path):
    import numpy as np

    url = tmp_path / "s"
    with ckptstore.open(url) as store:
        store.commit({"np": np.arange(6, dtype=np.int16).reshape(2, 3), "scalar": np.float32(2.5),
                      "z": torch.ones(2, dtype=torch.complex128), "blob": b"\x00\x01"})
    out_file = tmp_path / "x.safetensors"
    rc, out, err = run(capsys, "export", url, "main", out_file)
    assert rc == 0 and "2 entries skipped" in out
    assert "export skipped z (complex128" in err and "export skipped blob" in err
    loaded = safetensors_torch.load_file(str(out_file))
    assert torch.equal(loaded["np"], torch.arange(6, dtype=torch.int16).reshape(2, 3))
    assert loaded["scalar"].shape == () and loaded["scalar"].item() == 2.5


def test_chain_commits(capsys, tmp_path):
    """Incremental (consecutive) commits: show, du, diff and export follow the chain."""
    from ckptstore.policy import Policy

    url = tmp_path / "chain"
    emb = torch.zeros(2048, 16)
    with ckptstore.open(url, policy=Policy(incremental="consecutive", min_rows=64)) as store:
        for step in (1, 2, 3):
            emb[step * 10] += step
            store.commit({"emb": emb, "step": step})
        chain_ids = [c.id for c in store.log()]
        layout = store.manifest(chain_ids[0]).tensors[0].layout
    if layout != "chain":
        pytest.skip("the store wrote no chain entry for this policy")
    show = run_json(capsys, "show", url, "main")
    assert show["tensors"][0]["layout"] == "chain" and show["tensors"][0]["stored_bytes"] > 0
    assert "consecutive" in show["tensors"][0]["note"]
    rows = {r["id"]: r for r in run_json(capsys, "du", url)["commits"]}
    assert rows[chain_ids[0]]["reads"] == sorted(chain_ids[1:])
    assert rows[chain_ids[2]]["reads"] == [] and rows[chain_ids[2]]["shared_bytes"] == 0
    assert 0 < rows[chain_ids[0]]["shared_bytes"] < rows[chain_ids[0]]["total_bytes"]
    diff = run_json(capsys, "diff", url, "main~2", "main")
    assert [(c["path"], c["max_abs_diff"]) for c in diff["changed"]] == [("emb", 3.0)]
    run_json(capsys, "export", url, "main", tmp_path / "chain.safetensors")
    assert torch.equal(safetensors_torch.load_file(str(tmp_path / "chain.safetensors"))["emb"],
                       emb)


# -- remote stores ---------------------------------------------------------------------------------
def test_memory_store(capsys):
    url = f"memory://cli-{uuid.uuid4().hex}"
    with ckptstore.open(url) as store:
        store.commit({"w": torch.ones(3), "step": 7}, message="in memory")
    try:
        log = run_json(capsys, "log", url)
        assert [c["message"] for c in log] == ["in memory"]
        assert run(capsys, "verify", url)[0] == 0
    finally:
        import fsspec
        fsspec.filesystem("memory").rm(url.removeprefix("memory:/"), recursive=True)


@pytest.mark.s3
def test_s3_store_with_storage_options(capsys, s3_server):
    url = "s3://ckpt-tests/cli-run"
    with ckptstore.open(url, **s3_server) as store:
        store.commit({"w": torch.arange(4.0), "step": 3}, message="on s3")
    endpoint = s3_server["client_kwargs"]["endpoint_url"]
    opts = ["-o", f"client_kwargs.endpoint_url={endpoint}", "-o", "key=testing",
            "-o", "secret=testing", "-o", "use_listings_cache=false"]
    log = run_json(capsys, "log", url, *opts)
    assert [c["metadata"]["step"] for c in log] == [3]
    show = run_json(capsys, "show", url, "main", *opts)
    assert [t["path"] for t in show["tensors"]] == ["w"]
    rc, _, err = run(capsys, "log", "s3://ckpt-tests/not-a-store", *opts)
    assert rc == 3 and "no ckptstore" in err


# -- the installed console script ------------------------------------------------------------------
def _ckpt_script() -> str:
    found = Path(sys.executable).parent / "ckpt"
    if found.exists():
        return str(found)
    which = shutil.which("ckpt")
    if which is None:
        pytest.skip("the ckpt console script is not installed (pip install -e .)")
    return which


def test_console_script(ckpts):
    exe = _ckpt_script()
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([exe, "log", ckpts, "--json"], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert [c["id"] for c in json.loads(done.stdout)] == ids(ckpts)


def test_rebase_ends_chains(tmp_path, capsys):
    import ckptstore
    from ckptstore import Policy

    url = str(tmp_path / "chains")
    store = ckptstore.open(url, policy=Policy(incremental="consecutive"))
    emb = torch.zeros(4096, 16)
    for i in range(3):
        emb[i] += 1
        store.commit({"emb": emb})
    rc, out, _ = run(capsys, "rebase", url, "--json")
    assert rc == 0
    doc = json.loads(out)
    again = ckptstore.open(url, create=False)
    assert again.manifest(doc["id"]).tensors[0].kind == "full"
    assert torch.equal(again.checkout("main")["emb"], emb)
    removed = again.gc(keep_last=1, grace_period=0).commits_removed
    assert len(removed) == 3 and again.verify().ok
