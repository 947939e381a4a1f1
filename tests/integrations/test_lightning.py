"""StoreCheckpointIO with a real Lightning Trainer on scikit-learn's digits (CPU, 2 epochs)."""

from __future__ import annotations

import os
import pathlib
import warnings

import pytest
import torch

pytest.importorskip("lightning")
import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

import ckptstore
from ckptstore.errors import RefNotFound, UnsupportedLeafError
from ckptstore.lightning import StoreCheckpointIO, plain_checkpoint, tag_for_path

warnings.filterwarnings("ignore", ".*does not have many workers.*")
warnings.filterwarnings("ignore", ".*LightningModule.*")


class Digits(pl.LightningModule):
    def __init__(self, hidden: int = 16, lr: float = 0.01):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(hidden, 10))

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, _):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)}


def loaders() -> tuple[DataLoader, DataLoader]:
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y)
    train = TensorDataset(x[:256], y[:256])
    val = TensorDataset(x[1500:1628], y[1500:1628])
    return DataLoader(train, batch_size=64), DataLoader(val, batch_size=64)


def trainer(tmp: pathlib.Path, max_epochs: int, io: StoreCheckpointIO | None = None,
            **ckpt: object) -> pl.Trainer:
    callbacks = [ModelCheckpoint(dirpath=tmp / "ckpts", filename="{epoch}-{step}",
                                 monitor="val_loss", **ckpt)] if io else []
    return pl.Trainer(max_epochs=max_epochs, accelerator="cpu", devices=1, logger=False,
                      enable_progress_bar=False, enable_model_summary=False,
                      plugins=[io] if io else None, callbacks=callbacks,
                      enable_checkpointing=bool(io), deterministic=True)


def weights(model: pl.LightningModule) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_tag_for_path() -> None:
    assert tag_for_path("/a/b/epoch=1-step=10.ckpt") == "epoch_1-step_10"
    assert tag_for_path("last.ckpt") == "last"
    assert tag_for_path("-x.ckpt") == "ckpt--x"
    assert tag_for_path("a..b.lock") == "a.b.lock_"


def test_trainer_saves_into_the_store_and_resumes(tmp_path: pathlib.Path) -> None:
    url = str(tmp_path / "store")
    train, val = loaders()

    pl.seed_everything(0)
    full = Digits()  # uninterrupted, into its own store: save_top_k=1 removes epoch 0's tag
    full_io = StoreCheckpointIO(str(tmp_path / "full-store"), keep_last=1)
    t0 = trainer(tmp_path / "full", 2, full_io, save_top_k=1)
    t0.fit(full, train, val)
    full_store = ckptstore.open(str(tmp_path / "full-store"), create=False)
    assert set(full_store.tags()) == {"epoch_1-step_8"}
    # two commits were made; gc(keep_last=1) after the removal reclaimed epoch 0's
    assert full_store.commit_ids() == [full_store.resolve("epoch_1-step_8")]
    assert full_store.checkout("epoch_1-step_8")["global_step"] == 8

    pl.seed_everything(0)
    first = Digits()
    io = StoreCheckpointIO(url, keep_last=1)
    t1 = trainer(tmp_path / "run", 1, io, save_top_k=1, save_last=True)
    t1.fit(first, train, val)
    after_one_epoch = weights(first)
    best = t1.checkpoint_callback.best_model_path
    assert not os.path.exists(best)  # nothing but the store is written
    store = ckptstore.open(url, create=False)
    assert set(store.tags()) == {tag_for_path(best), "last"}
    head = store.checkout(tag_for_path(best))
    assert head["epoch"] == 0 and head["global_step"] == 4
    assert head["hyper_parameters"] == {"hidden": 16, "lr": 0.01}
    assert store.info(tag_for_path(best)).step == 4

    # a second trainer resumes from the path Lightning recorded as the best checkpoint
    pl.seed_everything(0)
    resumed = Digits()
    io2 = StoreCheckpointIO(url, keep_last=1)
    t2 = trainer(tmp_path / "run", 2, io2, save_top_k=1, save_last=True)
    loaded = io2.load_checkpoint(best)
    resumed.load_state_dict(loaded["state_dict"])
    assert all(torch.equal(after_one_epoch[k], v) for k, v in weights(resumed).items())
    t2.fit(resumed, train, val, ckpt_path=best)
    assert t2.current_epoch == 2 and t2.global_step == 8
    got, want = weights(resumed), weights(full)
    assert all(torch.equal(got[k], want[k]) for k in want)

    # Lightning never removes the checkpoint it resumed from: epoch 0 keeps its tag
    assert set(store.tags()) == {tag_for_path(best), "epoch_1-step_8", "last"}
    assert store.checkout("last")["global_step"] == 8


def test_remove_keeps_other_commits(tmp_path: pathlib.Path) -> None:
    io = StoreCheckpointIO(str(tmp_path / "s"), keep_last=1)
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "epoch": 0}, "a/epoch=0.ckpt")
    io.save_checkpoint({"state_dict": {"w": torch.zeros(3)}, "epoch": 1}, "a/epoch=1.ckpt")
    io.remove_checkpoint("a/epoch=0.ckpt")
    io.remove_checkpoint("a/never-saved.ckpt")  # like a missing file: nothing happens
    assert set(io.store.tags()) == {"epoch_1"}
    assert torch.equal(io.load_checkpoint("a/epoch=1.ckpt")["state_dict"]["w"], torch.zeros(3))
    assert torch.equal(io.load_checkpoint("main")["state_dict"]["w"], torch.zeros(3))
    with pytest.raises(RefNotFound, match="no tag 'epoch_0'"):
        io.load_checkpoint("a/epoch=0.ckpt")
    io.teardown()


def test_values_that_need_pickle(tmp_path: pathlib.Path) -> None:
    ckpt = {"hyper_parameters": {"path": pathlib.Path("/data"), "act": torch.nn.ReLU, "n": 3},
            "state_dict": {"w": torch.ones(2)}}
    with pytest.raises(UnsupportedLeafError, match="hyper_parameters.path"):
        plain_checkpoint(ckpt)
    state, converted = plain_checkpoint(ckpt, "str")
    assert state["hyper_parameters"]["path"] == "/data"
    assert state["state_dict"] is ckpt["state_dict"]
    assert converted == ["hyper_parameters.path", "hyper_parameters.act"]
    state, _ = plain_checkpoint(ckpt, "drop")
    assert state["hyper_parameters"] == {"n": 3}
    io = StoreCheckpointIO(str(tmp_path / "s"), unsupported="str")
    io.save_checkpoint(ckpt, "x.ckpt")
    assert io.store.info("x").metadata["lightning.converted"] == (
        "hyper_parameters.path, hyper_parameters.act")
