"""Hugging Face transformers: commit on every save of a ``Trainer``; export a commit for
``from_pretrained``.

``Trainer(..., callbacks=[StoreCallback(url)])`` commits, at each save (``save_steps``, end of
an epoch, ...), the state of training as tensors and plain values -- no pickle:

- ``model``: the model's ``state_dict()``;  ``config``: its ``config.json`` text;
- ``optimizer``, ``scheduler``: their ``state_dict()``s (when the trainer has them);
- ``rng``: Python's, numpy's and torch's generators (:func:`rng_state`), as tensors;
- ``trainer_state``: the ``TrainerState`` as JSON text (``trainer_state.json``).

Each commit is tagged ``checkpoint-<global step>`` (the name of the trainer's own folder) and
carries ``step`` and ``epoch`` metadata. :func:`export_pretrained` writes ``config.json`` and
``model.safetensors`` of a commit into a directory ``AutoModel.from_pretrained`` loads.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from typing import Any

import numpy as np
import torch

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("ckptstore.hf needs transformers: pip install transformers") from e

from .export.hf_dir import CONFIG_ENTRY, to_hf_directory
from .export.result import ExportResult
from .format.layout import check_ref_name
from .policy import Policy
from .store import Store
from .opening import open as open_store

__all__ = ["StoreCallback", "export_pretrained", "load_rng_state", "rng_state"]


def rng_state() -> dict[str, Any]:
    """The global generators of Python, numpy and torch (CPU, every CUDA device) as tensors and
    plain values."""
    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(mt, dtype=torch.int64),
                   "gauss_next": gauss},
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def load_rng_state(state: dict[str, Any]) -> None:
    """Set the global generators from :func:`rng_state`'s output (as checked out)."""
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss_next"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], np.asarray(n["keys"]).astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(state["cuda"]))


class StoreCallback(TrainerCallback):
    """A ``transformers.TrainerCallback`` that commits the training state at every save.

    Parameters
    ----------
    store
        A store URL (opened, and created if absent, on first save) or an open :class:`Store`.
    policy
        Commit policy (incremental, quantization, ...); default: the store's.
    branch
        Branch the commits go on.
    tag_format
        Tag of each commit, formatted with ``step`` (``None``: no tags). A tag that exists moves.
    """

    def __init__(self, store: str | os.PathLike[str] | Store, policy: Policy | None = None,
                 branch: str = "main", tag_format: str | None = "checkpoint-{step}",
                 **open_options: Any):
        self.url = None if isinstance(store, Store) else store
        self._store = store if isinstance(store, Store) else None
        self.policy, self.branch = policy, check_ref_name(branch, "branch")
        self.tag_format, self.open_options = tag_format, open_options

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = open_store(self.url, **self.open_options)  # type: ignore[arg-type]
        return self._store

    def state(self, state: TrainerState, model: Any, optimizer: Any = None,
              lr_scheduler: Any = None) -> dict[str, Any]:
        """What one save commits (see the module docstring)."""
        out: dict[str, Any] = {"model": model.state_dict()}
        config = getattr(model, "config", None)
        if config is not None:
            out[CONFIG_ENTRY] = config.to_json_string()
        if optimizer is not None:
            out["optimizer"] = optimizer.state_dict()
        if lr_scheduler is not None:
            out["scheduler"] = lr_scheduler.state_dict()
        out["rng"] = rng_state()
        out["trainer_state"] = json.dumps(dataclasses.asdict(state), sort_keys=True)
        return out

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                model: Any = None, optimizer: Any = None, lr_scheduler: Any = None,
                **kwargs: Any) -> None:
        """Commit the training state (on the main process only)."""
        if not state.is_world_process_zero or model is None:
            return
        step = state.global_step
        metadata = {"step": step, "epoch": float(state.epoch or 0.0),
                    "hf.output_dir": str(args.output_dir)}
        info = self.store.commit(self.state(state, model, optimizer, lr_scheduler),
                                 message=f"transformers: checkpoint-{step}", branch=self.branch,
                                 metadata=metadata, policy=self.policy)
        if self.tag_format:
            tag = self.tag_format.format(step=step)
            if tag in self.store.tags():
                self.store.delete_tag(tag)
            self.store.tag(tag, info.id)

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        """Close a store this callback opened (a later save opens it again)."""
        if self._store is not None and self.url is not None:
            self._store.close()
            self._store = None


def export_pretrained(store: Store, ref: str, directory: str | os.PathLike[str],
                      prefix: str = "model.", config: Any = None,
                      overwrite: bool = False) -> ExportResult:
    """Write ``config.json`` and ``model.safetensors`` of a commit into ``directory``, which
    ``from_pretrained`` loads; see :func:`ckptstore.export.to_hf_directory`."""
    return to_hf_directory(store, ref, directory, prefix=prefix, config=config,
                           overwrite=overwrite)
