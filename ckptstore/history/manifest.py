"""The on-store commit record (format v1): pydantic models, msgpack framing, format version.

A manifest file is::

    b"CKPT" | u8 format version | 32-byte sha256 of the payload | msgpack payload

so a truncated or altered manifest is detected before it is parsed, and a newer format is refused
with :class:`~ckptstore.errors.FormatVersionError` instead of being misread.
"""

from __future__ import annotations

import hashlib
import json
import math
from enum import Enum
from typing import Any, Literal

import msgpack
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..errors import FormatVersionError, ManifestError, NotAStoreError
from ..format.grid import ChunkGrid, boxes_overlap
from ..format.layout import is_array_name
from ..limits import METADATA_NESTING, TREE_NESTING, nesting

__all__ = [
    "FORMAT_VERSION",
    "Blob",
    "Kind",
    "Layout",
    "Manifest",
    "PackedInfo",
    "ShardPiece",
    "TensorEntry",
    "decode_manifest",
    "decode_marker",
    "encode_manifest",
    "encode_marker",
    "version_needed",
]

FORMAT_VERSION = 7   # the newest manifest format this library reads and writes
BASE_VERSION = 1     # what a manifest without sharded or xor entries is written as (v1 reads it)
SHARDED_VERSION = 2  # sharded entries and per-rank packed arrays
XOR_VERSION = 3      # xor chain entries, changed rows as xor (xvalues), content digests
RESIDUAL_VERSION = 4  # residual chain entries (pruned, quantized weight residuals: ExCP)
DIM_ORDER_VERSION = 5  # entries that record a memory layout (channels_last, transposed)
CHUNK_DIGESTS_VERSION = 6  # full arrays that record the sha256 of each chunk's bits (dedup)
HALF_RESIDUAL_VERSION = 7  # residual entries of bfloat16/float16 tensors (added in float32)
MARKER_VERSION = 1   # the store marker: a store holds manifests of any version up to ours
MAGIC = b"CKPT"
_HEADER = len(MAGIC) + 1 + 32
_ID = r"^[0-9a-f]{32}$"
_LAST_TIME = 253402300799.0  # 9999-12-31T23:59:59Z: the last second a datetime holds


class Layout(str, Enum):
    """Where the bits of a manifest entry live (shared by the plan and the manifest)."""

    ARRAY = "array"    # its own zarr array data/<commit>/<array>
    PACKED = "packed"  # a slice of the commit's packed array of small tensors
    ALIAS = "alias"    # the very same tensor as an earlier entry (tied weights)
    VIEW = "view"      # a strided view of a shared storage
    CHAIN = "chain"    # parts applied to the same path in a base commit
    SHARDED = "sharded"  # pieces of a global tensor, each an entry of the manifest's shards

    def __str__(self) -> str:
        return self.value


class Kind(str, Enum):
    """How an entry builds on older commits (Check-N-Run section 5.1, DynaQuant section 6)."""

    FULL = "full"                # the whole tensor: a baseline
    INCREMENTAL = "incremental"  # rows changed since the baseline (one-shot, intermittent)
    CONSECUTIVE = "consecutive"  # rows changed since the previous commit
    DELTA = "delta"              # quantization codes as deltas against the previous commit's
    XOR = "xor"                  # the bits XOR the previous commit's bits (lossless, format 3)
    RESIDUAL = "residual"        # a quantized residual added to the previous version (format 4)

    def __str__(self) -> str:
        return self.value


class _Model(BaseModel):
    # enum fields hold Layout / Kind members; being str enums they pack as their plain values,
    # so the msgpack payload is the same as with strings
    model_config = ConfigDict(extra="forbid", frozen=True)


def _bad_name(name: str) -> bool:
    return not is_array_name(name)  # layout's rule: one safe path component


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
        if _bad_name(self.array):
            raise ValueError(f"bad array name {self.array!r}")
        return self


# the parts each chain kind may have; ``xvalues``: changed rows XOR their old values (format 3)
_ROWS_PARTS = ({"rows", "values"}, {"rows", "xvalues"})
_CHAIN_PARTS = {Kind.INCREMENTAL: _ROWS_PARTS, Kind.CONSECUTIVE: _ROWS_PARTS,
                Kind.DELTA: ({"codes"},), Kind.XOR: ({"xor"},), Kind.RESIDUAL: ({"residual"},)}


class ShardPiece(_Model):
    """One piece of a sharded tensor: ``shards[entry]`` placed at ``offsets`` of the tensor."""

    offsets: list[int]
    entry: int = Field(ge=0)

    @model_validator(mode="after")
    def _check(self) -> ShardPiece:
        if any(o < 0 for o in self.offsets):
            raise ValueError("negative shard offset")
        return self


class TensorEntry(_Model):
    """How to rebuild one tensor (or one shared storage) of a commit.

    ``layout``:
      - ``array``: its own zarr array ``data/<commit>/<array>``;
      - ``packed``: ``nbytes`` bytes at ``offset`` of the commit's packed array (small tensors);
      - ``alias``: the very same tensor as ``tensors[base]`` (tied weights);
      - ``view``: ``as_strided(storages[base], shape, stride, storage_offset)`` (views that share a
        storage partially);
      - ``chain``: ``kind`` says how ``parts`` apply to the same path in ``base_commit``
        (see :mod:`ckptstore.chains.decide`);
      - ``sharded``: a tensor of global ``shape`` written by many ranks, one entry of
        :attr:`Manifest.shards` per ``pieces`` item (format 2).

    A ``packed`` entry with an ``array`` lies in that one of :attr:`Manifest.packs` (each rank of
    a sharded commit packs its own small tensors); without, in :attr:`Manifest.packed`.
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
    pieces: list[ShardPiece] | None = None
    digest: str | None = Field(default=None, pattern=r"^sha256:[0-9a-f]{64}$")  # format 3
    dim_order: list[int] | None = None  # format 5: memory layout, outermost dimension first
    # format 6: the sha256 of each chunk's bits (as the codec got them: edge chunks padded),
    # hex, back to back in chunk order -- chunk-level dedup (:mod:`ckptstore.commit.dedup`)
    chunk_digests: str | None = Field(default=None, pattern=r"^(?:[0-9a-f]{64})*$")

    @model_validator(mode="after")
    def _check_layout(self) -> TensorEntry:
        need = {"array": ("commit", "array", "codec", "chunks"),
                "packed": ("commit", "offset", "nbytes"), "alias": ("base",),
                "view": ("base", "storage_offset", "stride"),
                "chain": ("base_commit", "parts", "codec", "chunks"),
                "sharded": ("pieces", "commit")}[self.layout]
        if (self.layout == Layout.CHAIN) != (self.kind != Kind.FULL):
            raise ValueError(f"kind '{self.kind}' does not go with layout '{self.layout}'")
        if self.layout == Layout.CHAIN and set(self.parts or {}) not in _CHAIN_PARTS[self.kind]:
            raise ValueError(f"kind '{self.kind}' needs parts " + " or ".join(
                str(sorted(p)) for p in _CHAIN_PARTS[self.kind]))
        missing = [n for n in need if getattr(self, n) is None]
        if missing:
            raise ValueError(f"layout '{self.layout}' needs {missing}")
        if any(s < 0 for s in self.shape):
            raise ValueError("negative dimension")
        if self.array is not None and _bad_name(self.array):
            raise ValueError(f"bad array name {self.array!r}")
        if self.pieces is not None and any(len(p.offsets) != len(self.shape)
                                           for p in self.pieces):
            raise ValueError("a shard's offsets do not match the tensor's dimensions")
        if self.dim_order is not None and (
                self.layout not in (Layout.ARRAY, Layout.PACKED, Layout.CHAIN)
                or self.container == "numpy-scalar"
                or sorted(self.dim_order) != list(range(len(self.shape)))):
            raise ValueError(f"bad dim_order {self.dim_order} for a {self.layout} entry of "
                             f"shape {self.shape}")
        if self.chunk_digests is not None:
            n = -1
            if self.layout == Layout.ARRAY:
                try:
                    n = ChunkGrid.checked(self.shape, self.chunks).nchunks
                except ManifestError as e:
                    raise ValueError(str(e)) from None
            if len(self.chunk_digests) != 64 * n:
                raise ValueError(f"chunk_digests of {len(self.chunk_digests) // 64} chunks for "
                                 f"a {self.layout} entry of {max(n, 0)} chunks")
        return self


class PackedInfo(_Model):
    """An array that holds small tensors back to back (a commit's, or one rank's of it)."""

    array: str
    nbytes: int = Field(ge=0)
    chunks: list[int]
    codec: dict[str, Any]

    @model_validator(mode="after")
    def _check(self) -> PackedInfo:
        if _bad_name(self.array.lstrip("_")) or self.array.startswith("__"):
            raise ValueError(f"bad packed array name {self.array!r}")
        return self


class Manifest(_Model):
    """An immutable commit record."""

    format_version: int
    id: str = Field(pattern=_ID)
    parent: str | None = Field(default=None, pattern=_ID)
    generation: int = Field(default=0, ge=0)  # commits before this one on its first-parent line
    time: float = Field(ge=0, le=_LAST_TIME, allow_inf_nan=False)  # seconds since 1970, UTC
    message: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)
    tree: Any
    tensors: list[TensorEntry] = Field(default_factory=list)
    storages: list[TensorEntry] = Field(default_factory=list)
    packed: PackedInfo | None = None
    shards: list[TensorEntry] = Field(default_factory=list)  # pieces of sharded tensors (v2)
    packs: list[PackedInfo] = Field(default_factory=list)    # per-rank packed arrays (v2)
    logical_bytes: int = Field(ge=0)
    stored_bytes: int = Field(ge=0)
    library: str = ""

    @model_validator(mode="after")
    def _check_refs(self) -> Manifest:
        for field, limit in (("tree", TREE_NESTING), ("metadata", METADATA_NESTING)):
            if nesting(getattr(self, field)) > limit:
                raise ValueError(f"{field} nested deeper than {limit} levels, beyond what "
                                 "ckptstore writes")
        packs = {p.array: p for p in self.packs}
        if len(packs) != len(self.packs) or (self.packed is not None and self.packed.array in packs):
            raise ValueError("two packed arrays share a name")
        for i, t in enumerate(self.tensors):
            if t.layout == "alias" and (t.base >= i or self.tensors[t.base].layout == "alias"):
                raise ValueError(f"tensor {i} aliases an invalid entry {t.base}")
            if t.layout == "view" and t.base >= len(self.storages):
                raise ValueError(f"tensor {i} views a missing storage {t.base}")
            if t.layout == Layout.SHARDED:
                self._check_pieces(t)
        for e in (*self.tensors, *self.storages, *self.shards):
            if e.layout == Layout.PACKED and e.nbytes:
                info = self.packed if e.array is None else packs.get(e.array)
                if info is None or e.offset + e.nbytes > info.nbytes:
                    raise ValueError(f"tensor {e.path!r} lies outside its packed array")
        for s in self.storages:
            if s.layout not in ("array", "packed"):
                raise ValueError("a storage must be an array or packed")
        for s in self.shards:
            if s.layout not in ("array", "packed", "chain"):
                raise ValueError("a shard must be an array, packed or a chain entry")
        if len({s.path for s in self.shards}) != len(self.shards):
            raise ValueError("two shards share a path")
        return self

    def _check_pieces(self, t: TensorEntry) -> None:
        if t.commit != self.id:
            raise ValueError(f"sharded tensor {t.path!r} names another commit")
        volume = 0
        for p in t.pieces:
            if p.entry >= len(self.shards):
                raise ValueError(f"tensor {t.path!r} names a missing shard {p.entry}")
            s = self.shards[p.entry]
            if s.dtype != t.dtype or len(s.shape) != len(t.shape) or any(
                    o + n > g for o, n, g in zip(p.offsets, s.shape, t.shape)):
                raise ValueError(f"a shard of {t.path!r} does not fit inside the tensor")
            volume += math.prod(s.shape)
        if volume != math.prod(t.shape) or boxes_overlap(
                [(p.offsets, self.shards[p.entry].shape) for p in t.pieces]):
            raise ValueError(f"the shards of {t.path!r} do not cover the tensor exactly once")

    def entries(self) -> tuple[TensorEntry, ...]:
        """Every entry: tensors, shared storages, shards."""
        return (*self.tensors, *self.storages, *self.shards)

    def pack_infos(self) -> list[PackedInfo]:
        """Every packed array of the commit (the single-process one, then per-rank ones)."""
        return ([self.packed] if self.packed is not None else []) + list(self.packs)

    def pack_info(self, e: TensorEntry) -> PackedInfo | None:
        """The packed array a ``packed`` entry lies in."""
        if e.array is None:
            return self.packed
        return next((p for p in self.packs if p.array == e.array), None)

    def data_commits(self) -> set[str]:
        """Commits whose ``data/`` this commit's own entries point into."""
        entries = self.entries()
        out = {t.commit for t in entries if t.commit}
        for t in entries:
            out.update(b.commit for b in (t.parts or {}).values())
        if self.pack_infos():
            out.add(self.id)
        return out

    def base_commits(self) -> set[str]:
        """Commits whose entries this commit's chain entries build on (their manifests too)."""
        return {t.base_commit for t in (*self.tensors, *self.shards) if t.base_commit}


def version_needed(entries: list[TensorEntry], sharded: bool) -> int:
    """The oldest manifest format that holds these entries: older readers refuse what they
    cannot rebuild instead of misreading it."""
    if any(e.kind == Kind.RESIDUAL and e.dtype in ("bfloat16", "float16") for e in entries):
        return HALF_RESIDUAL_VERSION  # a reader of 4..6 would add their bits as integers
    if any(e.chunk_digests is not None for e in entries):
        return CHUNK_DIGESTS_VERSION
    if any(e.dim_order is not None for e in entries):
        return DIM_ORDER_VERSION
    if any(e.kind == Kind.RESIDUAL for e in entries):
        return RESIDUAL_VERSION
    if any(e.kind == Kind.XOR or "xvalues" in (e.parts or {}) or e.digest for e in entries):
        return XOR_VERSION
    return SHARDED_VERSION if sharded else BASE_VERSION


def encode_manifest(m: Manifest) -> bytes:
    raw = m.model_dump(mode="python")
    for key in ("shards", "packs"):  # a manifest without them is exactly format 1
        if not raw[key]:
            del raw[key]
    for e in (*raw["tensors"], *raw["storages"], *raw.get("shards", ())):
        # absent, not None: earlier formats' layout
        for key in ("pieces", "digest", "dim_order", "chunk_digests"):
            if e[key] is None:
                del e[key]
    payload = msgpack.packb(raw, use_bin_type=True)
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
    return json.dumps({"format": "ckptstore", "version": MARKER_VERSION}, indent=1).encode()


def decode_marker(data: bytes, where: str) -> int:
    """Return the format version of a store marker, refusing anything else."""
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise NotAStoreError(f"{where} is not a ckptstore marker ({e})") from e
    if not isinstance(doc, dict) or doc.get("format") != "ckptstore" or not isinstance(
            doc.get("version"), int):
        raise NotAStoreError(f"{where} is not a ckptstore marker")
    if doc["version"] > MARKER_VERSION:
        raise FormatVersionError(
            f"the store at {where} has format version {doc['version']}; this ckptstore reads up to "
            f"{MARKER_VERSION}: upgrade ckptstore (pip install -U ckptstore)")
    return doc["version"]
