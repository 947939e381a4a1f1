"""PyTorch Lightning: checkpoints saved by a ``Trainer`` become commits of a ckptstore.

>>> from ckptstore.lightning import StoreCheckpointIO, tag_for_path
>>> tag_for_path("/runs/ckpts/epoch=1-step=10.ckpt")
'epoch_1-step_10'

``Trainer(plugins=[StoreCheckpointIO(url)])`` routes every save, load and removal of a checkpoint
through the store, whatever callback asks for it (``ModelCheckpoint``, ``trainer.save_checkpoint``):

- ``save_checkpoint(checkpoint, path)`` commits the checkpoint dict on ``branch`` and points the tag
  :func:`tag_for_path` ``(path)`` at it (moved if a previous save used the same file name);
- ``load_checkpoint(path)`` checks out the commit of that tag, so ``trainer.fit(model,
  ckpt_path=path)`` and ``ckpt_path="best"`` resume; a path whose tag does not exist is taken as a
  ref (``"main"``, ``"main~2"``, a commit id or tag name);
- ``remove_checkpoint(path)`` deletes the tag only. The commit stays on the branch; gc reclaims it
  once retention lets it go (``keep_last=N`` runs ``store.gc(keep_last=N)`` after each removal;
  tagged commits, e.g. the ``save_top_k`` best, are always kept).

No file is written at ``path``. Values of the checkpoint that ckptstore cannot store without
pickling (objects in ``hyper_parameters``, say) raise :class:`UnsupportedLeafError` by default;
``unsupported="str"`` stores ``str(value)`` instead and ``"drop"`` leaves them out, both listing
the paths in the commit's metadata (``lightning.converted``).
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import torch

try:
    from lightning.pytorch.plugins.io import CheckpointIO
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("ckptstore.lightning needs Lightning: pip install 'lightning>=2.2'") from e

from .errors import RefNotFound, UnsupportedLeafError
from .format.ids import is_commit_id
from .format.layout import check_ref_name
from .policy import Policy
from .state.tree import is_stateful
from .store import Store
from .opening import open as open_store

__all__ = ["StoreCheckpointIO", "plain_checkpoint", "tag_for_path"]

Unsupported = Literal["error", "str", "drop"]
_SCALARS = (type(None), bool, int, float, str, bytes)
_KEYS = (str, int, float, bool, type(None))
_DROP = object()


def tag_for_path(path: str | os.PathLike[str]) -> str:
    """The tag a checkpoint path maps to: its file name without ``.ckpt``, every character outside
    ``[A-Za-z0-9._-]`` replaced by ``_`` (``epoch=1-step=10.ckpt`` -> ``epoch_1-step_10``)."""
    name = os.path.basename(os.fspath(path).rstrip("/\\"))
    name = name.removesuffix(".ckpt")
    name = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    name = re.sub(r"\.{2,}", ".", name).strip(".")
    if name.endswith(".lock"):
        name += "_"
    if not name or not re.match(r"[A-Za-z0-9_]", name) or is_commit_id(name):
        name = f"ckpt-{name}"
    return check_ref_name(name[:200], "tag")


def plain_checkpoint(checkpoint: Any, unsupported: Unsupported = "error"
                     ) -> tuple[Any, list[str]]:
    """The checkpoint with every value ckptstore can store; ``(state, converted paths)``.

    Tensors, numeric arrays, plain scalars, dicts, lists, tuples and objects with
    ``state_dict()`` pass unchanged; anything else is refused (``"error"``), stored as
    ``str(value)`` (``"str"``) or left out (``"drop"``).
    """
    if unsupported not in ("error", "str", "drop"):
        raise ValueError("unsupported must be 'error', 'str' or 'drop'")
    converted: list[str] = []

    def walk(obj: Any, path: str) -> Any:
        if isinstance(obj, (torch.Tensor, np.generic, *_SCALARS)):
            return obj
        if is_stateful(obj) and not isinstance(obj, type):  # a module class is no module
            return obj
        if isinstance(obj, np.ndarray) and obj.dtype.kind in "biufc":
            return obj
        if isinstance(obj, Mapping):
            items = {}
            changed = type(obj) not in (dict, OrderedDict)  # AttributeDict -> dict
            for k, v in obj.items():
                key = k if isinstance(k, _KEYS) else _bad(k, f"{path}[{k!r}] (a dict key)")
                new = walk(v, f"{path}.{k}" if path else str(k))
                changed |= new is not v or key is not k
                if new is not _DROP and key is not _DROP:
                    items[key] = new
            if not changed:
                return obj
            out: dict[Any, Any] = OrderedDict(items) if isinstance(obj, OrderedDict) else items
            if isinstance(obj, OrderedDict) and hasattr(obj, "_metadata"):
                out._metadata = obj._metadata  # type: ignore[attr-defined]
            return out
        if isinstance(obj, (list, tuple)):
            new_items = [walk(v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(obj)]
            if all(n is v for n, v in zip(new_items, obj)) and type(obj) in (list, tuple):
                return obj
            kept = [v for v in new_items if v is not _DROP]
            return tuple(kept) if isinstance(obj, tuple) else kept
        return _bad(obj, path)

    def _bad(obj: Any, path: str) -> Any:
        if unsupported == "error":
            raise UnsupportedLeafError(
                f"the Lightning checkpoint holds {type(obj).__module__}.{type(obj).__qualname__} "
                f"at {path or '<root>'!r}, which ckptstore cannot store without pickling: leave "
                "it out (e.g. self.save_hyperparameters(ignore=[...])), convert it to plain "
                "values, or pass StoreCheckpointIO(..., unsupported='str' or 'drop')")
        converted.append(path)
        return str(obj) if unsupported == "str" else _DROP

    return walk(checkpoint, ""), converted


class StoreCheckpointIO(CheckpointIO):
    """A Lightning ``CheckpointIO`` that keeps checkpoints as commits of a ckptstore.

    Parameters
    ----------
    store
        A store URL (opened, and created if absent, on first use) or an open :class:`Store`.
    policy
        Commit policy (incremental, quantization, ...); default: the store's.
    branch
        Branch the commits go on.
    keep_last
        After a checkpoint is removed, run ``store.gc(keep_last=keep_last)`` (tags are kept);
        ``None``: leave collection to ``ckpt gc``.
    unsupported
        What to do with values that cannot be stored without pickling: ``"error"``, ``"str"``
        or ``"drop"`` (see :func:`plain_checkpoint`).
    """

    def __init__(self, store: str | os.PathLike[str] | Store, policy: Policy | None = None,
                 branch: str = "main", keep_last: int | None = None,
                 unsupported: Unsupported = "error", **open_options: Any):
        self.url = store if not isinstance(store, Store) else None
        self._store = store if isinstance(store, Store) else None
        self.policy, self.keep_last = policy, keep_last
        self.branch = check_ref_name(branch, "branch")
        self.unsupported = unsupported
        self.open_options = open_options

    @property
    def store(self) -> Store:
        """The store, opened on first use (and again after :meth:`teardown`)."""
        if self._store is None:
            self._store = open_store(self.url, **self.open_options)  # type: ignore[arg-type]
        return self._store

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any | None = None) -> None:
        """Commit ``checkpoint`` and point the tag of ``path`` at the commit."""
        if storage_options is not None:
            raise TypeError("StoreCheckpointIO takes no storage_options; pass the store's options "
                            "to StoreCheckpointIO(url, ...) instead")
        tag = tag_for_path(path)
        state, converted = plain_checkpoint(checkpoint, self.unsupported)
        metadata: dict[str, Any] = {"lightning.path": os.fspath(path)}
        for key in ("epoch", "global_step"):
            if isinstance(checkpoint.get(key), int):
                metadata["step" if key == "global_step" else key] = checkpoint[key]
        if converted:
            metadata["lightning.converted"] = ", ".join(converted)
        store = self.store
        info = store.commit(state, message=f"lightning: {os.path.basename(os.fspath(path))}",
                            branch=self.branch, metadata=metadata, policy=self.policy)
        if tag in store.tags():
            store.delete_tag(tag)  # the same file name saved again (last.ckpt): the tag moves
        store.tag(tag, info.id)

    def resolve(self, path: Any) -> str:
        """The commit id a checkpoint path (or a ref such as ``"main~1"``) names."""
        tag = tag_for_path(path)
        if tag in self.store.tags():
            return self.store.resolve(tag)
        try:
            return self.store.resolve(os.fspath(path))
        except RefNotFound:
            raise RefNotFound(
                f"no checkpoint {os.fspath(path)!r} in {self.store.storage.url}: no tag {tag!r} "
                f"and no ref of that name (tags: {', '.join(sorted(self.store.tags())) or 'none'})"
            ) from None

    def load_checkpoint(self, path: Any, map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        """Check out the commit ``path`` names (tensors on CPU unless ``map_location`` is a
        device or device string)."""
        where = map_location if isinstance(map_location, (str, torch.device)) else None
        return self.store.checkout(self.resolve(path), map_location=where, for_resume=True)

    def remove_checkpoint(self, path: Any) -> None:
        """Delete the tag of ``path`` (nothing if there is none); gc reclaims the data later."""
        tag = tag_for_path(path)
        if tag in self.store.tags():
            self.store.delete_tag(tag)
        if self.keep_last is not None:
            self.store.gc(keep_last=self.keep_last)

    def teardown(self) -> None:
        """Close a store this plugin opened (a later use opens it again)."""
        if self._store is not None and self.url is not None:
            self._store.close()
            self._store = None
