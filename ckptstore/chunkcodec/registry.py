"""Chunk codecs by id: the manifest records each array's codec as a config dict whose ``"id"``
names a registered :class:`~ckptstore.chunkcodec.ChunkCodec` class (numcodecs' registry, for the
store's own chunk pipelines)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from ..errors import ManifestError
from .base import ChunkCodec

__all__ = ["chunk_codec_ids", "codec_from_config", "register_chunk_codec"]

C = TypeVar("C", bound=type[ChunkCodec])

_REGISTRY: dict[str, type[ChunkCodec]] = {}


def register_chunk_codec(cls: C) -> C:
    """Register ``cls`` under its ``codec_id``; returns ``cls`` (use it as a class decorator).

    Raises ``ValueError`` if another class already holds the id: an id read from a manifest must
    always mean the same byte layout.
    """
    codec_id = cls.codec_id
    if not isinstance(codec_id, str) or not codec_id:
        raise ValueError(f"{cls.__name__}.codec_id must be a non-empty string, not {codec_id!r}")
    held = _REGISTRY.get(codec_id)
    # the same class again (a module reload) replaces itself
    if held is not None and (held.__module__, held.__qualname__) != (cls.__module__,
                                                                      cls.__qualname__):
        raise ValueError(f"chunk codec id {codec_id!r} is already registered to {held.__name__}")
    _REGISTRY[codec_id] = cls
    return cls


def chunk_codec_ids() -> list[str]:
    """The ids this ckptstore can read, sorted."""
    return sorted(_REGISTRY)


def codec_from_config(config: Mapping[str, Any]) -> ChunkCodec:
    """Rebuild a chunk codec from the dict stored in a manifest.

    Raises :class:`~ckptstore.errors.ManifestError` for an unknown id (the store was written by
    a newer ckptstore) or a config its codec rejects.
    """
    codec_id = config.get("id") if isinstance(config, Mapping) else None
    cls = _REGISTRY.get(codec_id) if isinstance(codec_id, str) else None
    if cls is None:
        raise ManifestError(f"unknown chunk codec {config!r}: the store was written by a newer "
                            "ckptstore; upgrade it")
    try:
        return cls.from_config(config)
    except (TypeError, ValueError) as e:
        # an option this version does not know (TypeError) may come from a newer writer
        hint = "; if a newer ckptstore wrote it, upgrade" if isinstance(e, TypeError) else ""
        raise ManifestError(f"invalid chunk codec {config!r}: {e}{hint}") from e
