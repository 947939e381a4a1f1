"""A Hugging Face model folder as a source: ``config.json`` and the weights of
``model.safetensors`` or ``pytorch_model.bin``, sharded (``*.index.json``) or not. Every file it
names must stay inside the folder."""

from __future__ import annotations

import os

import torch

from .files import read_safetensors, read_tensor_file
from .source import ImportSourceError, inside, parse_json, read_json, read_text

__all__ = ["read_hf_directory"]

_LAYOUTS = (("model.safetensors.index.json", "model.safetensors",
             lambda p: read_safetensors(p)[0]),
            ("pytorch_model.bin.index.json", "pytorch_model.bin", read_tensor_file))


def _weight_map(directory: str, index: str) -> dict[str, str]:
    """The ``weight_map`` of an index file: tensor name -> shard file name."""
    data = read_json(inside(directory, index, index), index)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not (isinstance(weight_map, dict) and weight_map and all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items())):
        raise ImportSourceError(f"{os.path.join(directory, index)}: its weight_map must map "
                                "tensor names to shard file names")
    return weight_map


def read_hf_directory(directory: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], str]:
    """``(weights, config.json text)`` of a Hugging Face model directory.

    Raises
    ------
    ImportSourceError
        No weights, a config.json that is not a JSON object, an index file that is not UTF-8 JSON
        with a weight_map, a shard that is missing, leaves the folder, lacks a tensor its index
        names, or repeats one another shard holds.
    """
    directory = os.fspath(directory)
    config_file = inside(directory, "config.json", "config.json")
    text = read_text(config_file, "config.json")
    if not isinstance(parse_json(text, config_file, "config.json"), dict):
        raise ImportSourceError(f"{config_file} is not a JSON object (a model's config)")
    names = os.listdir(directory)
    for index, single, reader in _LAYOUTS:
        if index in names:
            weight_map = _weight_map(directory, index)
        elif single in names:
            weight_map = None
        else:
            continue
        files = sorted(set(weight_map.values())) if weight_map else [single]
        weights: dict[str, torch.Tensor] = {}
        for name in files:
            part = reader(inside(directory, name, f"{index} weight_map" if weight_map else name))
            if weight_map is not None:
                missing = sorted(k for k, v in weight_map.items() if v == name and k not in part)
                if missing:
                    raise ImportSourceError(f"{name} does not hold {missing[0]!r}, which {index} "
                                            "places there: the folder is incomplete or damaged")
            twice = part.keys() & weights.keys()
            if twice:
                raise ImportSourceError(f"{name} repeats {sorted(twice)[0]!r}, which another "
                                        "shard holds: which one is meant is unknown")
            weights.update(part)
        return weights, text
    raise ImportSourceError(f"{directory} has config.json but no model.safetensors, "
                            "pytorch_model.bin or their .index.json")
