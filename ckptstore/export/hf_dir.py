"""A commit as a Hugging Face model directory: ``config.json`` + ``model.safetensors``.

The weights are the commit's entries under ``prefix`` (``"model."``: what
:class:`ckptstore.hf.StoreCallback` and ``ckpt import`` of a model directory commit), written by
:func:`~ckptstore.export.to_safetensors` with the prefix stripped. The config is the ``config``
entry of the commit (a JSON string), or the one given. ``from_pretrained(directory)`` loads it.
Needs no transformers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..state.leaves import Leaves
from ..history.repository import Repository
from .result import ExportError, ExportResult, target_path
from .safetensors_file import to_safetensors

if TYPE_CHECKING:
    from ..store import Store

__all__ = ["CONFIG_ENTRY", "to_hf_directory"]

CONFIG_ENTRY = "config"  # the commit entry holding the model's config.json text


def _config_text(repo: Repository, commit_id: str, config: Any) -> str:
    if config is None:
        value = Leaves.of(repo.manifest(commit_id)).values.get(CONFIG_ENTRY)
        if not isinstance(value, str):
            raise ExportError(
                f"commit {commit_id[:10]} has no {CONFIG_ENTRY!r} entry holding config.json text; "
                "pass config= (a transformers PretrainedConfig, a dict or a config.json path)")
        config = value
    if hasattr(config, "to_json_string"):  # a transformers PretrainedConfig
        return config.to_json_string()
    if isinstance(config, Mapping):
        return json.dumps(dict(config), indent=2, sort_keys=True) + "\n"
    if isinstance(config, (str, os.PathLike)) and os.path.isfile(config):
        with open(config, encoding="utf-8") as f:
            return f.read()
    if isinstance(config, str):
        try:
            json.loads(config)
        except ValueError:
            raise ExportError("config is neither JSON text nor a config.json file") from None
        return config
    raise ExportError(f"config= takes a PretrainedConfig, a dict, JSON text or a file, "
                      f"not {type(config).__name__}")


def to_hf_directory(store: Store | Repository, ref: str, directory: str | os.PathLike[str],
                    prefix: str = "model.", config: Any = None, overwrite: bool = False,
                    progress: bool = False) -> ExportResult:
    """Write ``directory/config.json`` and ``directory/model.safetensors`` from a commit.

    Parameters
    ----------
    store
        A :class:`~ckptstore.store.Store` or its ``repo``.
    ref
        Branch, tag, commit id or prefix.
    directory
        Created if absent.
    prefix
        The entries under it are the model's weights, keys without it (``""``: every tensor).
    config
        ``PretrainedConfig``, dict, JSON text or path of a config.json; default: the commit's
        ``config`` entry.
    overwrite
        Replace the files if they exist.

    Raises
    ------
    ExportError
        No config, files that exist (without ``overwrite``), or no tensor under ``prefix``.
    """
    repo = store if isinstance(store, Repository) else store.repo
    directory = target_path(directory)
    commit_id = repo.resolve(ref)
    text = _config_text(repo, commit_id, config)
    os.makedirs(directory, exist_ok=True)
    config_file = os.path.join(directory, "config.json")
    if os.path.exists(config_file) and not overwrite:
        raise ExportError(f"{config_file} exists; pass overwrite=True (ckpt export --force)")
    paths = [prefix.rstrip(".")] if prefix else None
    result = to_safetensors(repo, commit_id, os.path.join(directory, "model.safetensors"),
                            paths=paths, strip_prefix=prefix or None, overwrite=overwrite,
                            progress=progress)
    if result.tensors == 0:
        os.unlink(result.file)
        raise ExportError(f"commit {commit_id[:10]} has no tensor under {prefix!r}; choose the "
                          "prefix of the model's weights (--prefix)")
    with open(config_file, "w", encoding="utf-8") as f:
        f.write(text)
    return ExportResult(file=directory, commit=commit_id, tensors=result.tensors,
                        nbytes=result.nbytes + len(text.encode()),
                        metadata_keys=result.metadata_keys, skipped=result.skipped)
