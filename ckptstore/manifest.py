"""The on-store commit record (format v1): pydantic models, msgpack framing, format version.

A manifest file is::

    b"CKPT" | u8 format version | 32-byte sha256 of the payload | msgpack payload

so a truncated or altered manifest is detected before it is parsed, and a newer format is refused
with :class:`~ckptstore.errors.FormatVersionError` instead of being misread.
"""

from __future__ import annotations

import hashlib
import json
from enum import Enum
from typing import Any, Literal

import msgpack
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import FormatVersionError, ManifestError, NotAStoreError

__all__ = [
    "FORMAT_VERSION",
    "Blob",
    "Kind",
    "Layout",
    "Manifest",
    "PackedInfo",
    "TensorEntry",
    "decode_manifest",
    "decode_marker",
    "encode_manifest",
    "encode_marker",
]

FORMAT_VERSION = 1
MAGIC = b"CKPT"
_HEADER = len(MAGIC) + 1 + 32
_ID = r"^[0-9a-f]{32}$"


class Layout(str, Enum):
    """Where the bits of a manifest entry live (shared by the plan and the manifest)."""

    ARRAY = "array"    # its own zarr array data/<commit>/<array>
    PACKED = "packed"  # a slice of the commit's packed array of small tensors
    ALIAS = "alias"    # the very same tensor as an earlier entry (tied weights)
    VIEW = "view"      # a strided view of a shared storage
    CHAIN = "chain"    # parts applied to the same path in a base commit

    def __str__(self) -> str:
        return self.value


class Kind(str, Enum):
    """How an entry builds on older commits (Check-N-Run section 5.1, DynaQuant section 6)."""

    FULL = "full"                # the whole tensor: a baseline
    INCREMENTAL = "incremental"  # rows changed since the baseline (one-shot, intermittent)
    CONSECUTIVE = "consecutive"  # rows changed since the previous commit
    DELTA = "delta"              # quantization codes as deltas against the previous commit's

    def __str__(self) -> str:
        return self.value


class _Model(BaseModel):
    # enum fields hold Layout / Kind members; being str enums they pack as their plain values,
    # so the msgpack payload is the same as with strings
    model_config = ConfigDict(extra="forbid", frozen=True)


class Blob(_Model):
    """An array of a chain entry: changed rows and their values, or code deltas."""

    dtype: str  # numpy dtype of the stored bits
    shape: list[int]
    commit: str = Field(pattern=_ID)
    array: str
    chunks: list[int]
    codec: dict[str, Any]

    @model_validator(mode="after")
    def _check(self) -> Blob:
        if any(s < 0 for s in self.shape):
            raise ValueError("negative dimension")
        if not self.array or "/" in self.array or self.array.startswith((".", "__")):
            raise ValueError(f"bad array name {self.array!r}")
        return self


_CHAIN_PARTS = {Kind.INCREMENTAL: {"rows", "values"}, Kind.CONSECUTIVE: {"rows", "values"},
                Kind.DELTA: {"codes"}}


class TensorEntry(_Model):
    """How to rebuild one tensor (or one shared storage) of a commit.

    ``layout``:
      - ``array``: its own zarr array ``data/<commit>/<array>``;
      - ``packed``: ``nbytes`` bytes at ``offset`` of the commit's packed array (small tensors);
      - ``alias``: the very same tensor as ``tensors[base]`` (tied weights);
      - ``view``: ``as_strided(storages[base], shape, stride, storage_offset)`` (views that share a
        storage partially);
      - ``chain``: ``kind`` says how ``parts`` apply to the same path in ``base_commit``
        (see :mod:`ckptstore.chains.decide`).
    """

    path: str
    dtype: str
    shape: list[int] = Field(default_factory=list)
    layout: Layout
    kind: Kind = Kind.FULL
    container: Literal["torch", "numpy", "numpy-scalar"] = "torch"
    commit: str | None = Field(default=None, pattern=_ID)
    array: str | None = None
    codec: dict[str, Any] | None = None
    chunks: list[int] | None = None
    offset: int | None = Field(default=None, ge=0)
    nbytes: int | None = Field(default=None, ge=0)
    base: int | None = Field(default=None, ge=0)
    storage_offset: int | None = Field(default=None, ge=0)
    stride: list[int] | None = None
    base_commit: str | None = Field(default=None, pattern=_ID)
    parts: dict[str, Blob] | None = None
    chain: int = Field(default=0, ge=0)
    fractions: list[float] | None = None

    @model_validator(mode="after")
    def _check_layout(self) -> TensorEntry:
        need = {"array": ("commit", "array", "codec", "chunks"),
                "packed": ("commit", "offset", "nbytes"), "alias": ("base",),
                "view": ("base", "storage_offset", "stride"),
                "chain": ("base_commit", "parts", "codec", "chunks")}[self.layout]
        if (self.layout == Layout.CHAIN) != (self.kind != Kind.FULL):
            raise ValueError(f"kind '{self.kind}' does not go with layout '{self.layout}'")
        if self.layout == Layout.CHAIN and set(self.parts or {}) != _CHAIN_PARTS[self.kind]:
            raise ValueError(f"kind '{self.kind}' needs parts {sorted(_CHAIN_PARTS[self.kind])}")
        missing = [n for n in need if getattr(self, n) is None]
        if missing:
            raise ValueError(f"layout '{self.layout}' needs {missing}")
        if any(s < 0 for s in self.shape):
            raise ValueError("negative dimension")
        if self.array is not None and (not self.array or "/" in self.array
                                       or self.array.startswith((".", "__"))):
            raise ValueError(f"bad array name {self.array!r}")
        return self


class PackedInfo(_Model):
    """The one array that holds all small tensors of a commit, back to back."""

    array: str
    nbytes: int = Field(ge=0)
    chunks: list[int]
    codec: dict[str, Any]


class Manifest(_Model):
    """An immutable commit record."""

    format_version: int
    id: str = Field(pattern=_ID)
    parent: str | None = Field(default=None, pattern=_ID)
    generation: int = Field(default=0, ge=0)  # commits before this one on its first-parent line
    time: float
    message: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)
    tree: Any
    tensors: list[TensorEntry] = Field(default_factory=list)
    storages: list[TensorEntry] = Field(default_factory=list)
    packed: PackedInfo | None = None
    logical_bytes: int = Field(ge=0)
    stored_bytes: int = Field(ge=0)
    library: str = ""

    @model_validator(mode="after")
    def _check_refs(self) -> Manifest:
        for i, t in enumerate(self.tensors):
            if t.layout == "alias" and (t.base >= i or self.tensors[t.base].layout == "alias"):
                raise ValueError(f"tensor {i} aliases an invalid entry {t.base}")
            if t.layout == "view" and t.base >= len(self.storages):
                raise ValueError(f"tensor {i} views a missing storage {t.base}")
            if t.layout == Layout.PACKED and t.nbytes and (
                    self.packed is None or t.offset + t.nbytes > self.packed.nbytes):
                raise ValueError(f"tensor {i} lies outside the packed array")
        for s in self.storages:
            if s.layout not in ("array", "packed"):
                raise ValueError("a storage must be an array or packed")
        return self

    def data_commits(self) -> set[str]:
        """Commits whose ``data/`` this commit's own entries point into."""
        out = {t.commit for t in (*self.tensors, *self.storages) if t.commit}
        for t in self.tensors:
            out.update(b.commit for b in (t.parts or {}).values())
        if self.packed is not None:
            out.add(self.id)
        return out

    def base_commits(self) -> set[str]:
        """Commits whose entries this commit's chain entries build on (their manifests too)."""
        return {t.base_commit for t in self.tensors if t.base_commit}


def encode_manifest(m: Manifest) -> bytes:
    payload = msgpack.packb(m.model_dump(mode="python"), use_bin_type=True)
    return MAGIC + bytes([m.format_version]) + hashlib.sha256(payload).digest() + payload


def decode_manifest(data: bytes, where: str = "manifest") -> Manifest:
    """Parse and validate a manifest file; raise a ckptstore error naming ``where`` if bad."""
    if len(data) < _HEADER or data[:4] != MAGIC:
        raise ManifestError(f"{where} is truncated or not a ckptstore manifest")
    version = data[4]
    if version > FORMAT_VERSION:
        raise FormatVersionError(
            f"{where} has format version {version}, newer than this ckptstore reads "
            f"({FORMAT_VERSION}): upgrade ckptstore")
    payload = data[_HEADER:]
    if hashlib.sha256(payload).digest() != data[5:_HEADER]:
        raise ManifestError(f"{where} is truncated or corrupted (sha256 mismatch)")
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        return Manifest.model_validate(raw)
    except (ValueError, ValidationError, msgpack.ExtraData, msgpack.FormatError,
            msgpack.StackError, TypeError) as e:
        raise ManifestError(f"{where} is invalid: {e}") from e


def encode_marker() -> bytes:
    return json.dumps({"format": "ckptstore", "version": FORMAT_VERSION}, indent=1).encode()


def decode_marker(data: bytes, where: str) -> int:
    """Return the format version of a store marker, refusing anything else."""
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise NotAStoreError(f"{where} is not a ckptstore marker ({e})") from e
    if not isinstance(doc, dict) or doc.get("format") != "ckptstore" or not isinstance(
            doc.get("version"), int):
        raise NotAStoreError(f"{where} is not a ckptstore marker")
    if doc["version"] > FORMAT_VERSION:
        raise FormatVersionError(
            f"the store at {where} has format version {doc['version']}; this ckptstore reads up to "
            f"{FORMAT_VERSION}: upgrade ckptstore (pip install -U ckptstore)")
    return doc["version"]
