"""A commit's tensors as one plain safetensors file, streamed a batch at a time.

The header is known from the manifest before any tensor is read, so the file is written in one
pass: 8-byte little-endian header length, the JSON header (padded to 8 bytes), then each tensor's
little-endian bytes in header order. It is written to a temporary file beside the target and
renamed into place, so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..format.arrays import tensor_to_host
from ..errors import ManifestError
from ..checkout.batches import read_tensors
from ..state.leaves import Leaves, as_tensor, entry_nbytes
from ..history.manifest import Manifest
from ..progress import bar
from ..history.repository import Repository
from .result import ExportError, ExportResult, target_path

if TYPE_CHECKING:
    from ..store import Store

__all__ = ["MAX_METADATA_VALUE", "SAFETENSORS_DTYPES", "to_safetensors", "write_safetensors"]

MAX_METADATA_VALUE = 1024  # longest JSON text of a plain leaf put into __metadata__

# torch dtype name (as in manifests) -> safetensors dtype code
SAFETENSORS_DTYPES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
    "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "complex64": "C64",
}

Header = list[tuple[str, str, list[int], int]]  # (key, safetensors dtype, shape, bytes)


def write_safetensors(file: str, header_entries: Header, metadata: dict[str, str],
                      arrays: Iterable[tuple[str, np.ndarray]],
                      on_bytes: Callable[[int], object] = lambda n: None) -> int:
    """Stream a safetensors file through a temporary file renamed into place; return its size.

    ``header_entries`` are ``(key, safetensors dtype, shape, nbytes)``; ``arrays`` yields
    ``(key, host array)`` in the same order; ``on_bytes`` is told each array's size once written.
    """
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for key, dtype, shape, nbytes in header_entries:
        header[key] = {"dtype": dtype, "shape": list(shape),
                       "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(file)),
                               prefix=".ckpt-export-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(head)))
            f.write(head)
            expected = iter(header_entries)
            for key, arr in arrays:
                want_key, _, _, nbytes = next(expected)
                arr = np.ascontiguousarray(arr)
                arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
                if key != want_key or arr.nbytes != nbytes:
                    raise ManifestError(f"export: {key!r} has {arr.nbytes} bytes, "
                                         f"the manifest says {nbytes}")
                f.write(memoryview(arr.reshape(-1)).cast("B"))
                on_bytes(nbytes)
            if next(expected, None) is not None:
                raise ManifestError("export: fewer tensors were read than the manifest lists")
        os.replace(tmp, file)
    except BaseException:
        os.unlink(tmp)
        raise
    return len(head) + 8 + offset


def _check_target(file: str, overwrite: bool) -> None:
    if os.path.exists(file) and not overwrite:
        raise ExportError(f"{file} exists; pass overwrite=True (ckpt export --force) to "
                          "replace it")
    if not os.path.isdir(os.path.dirname(os.path.abspath(file))):
        raise ExportError(f"cannot write {file}: its folder does not exist; create it first")


def _key(path: str, strip: str | None) -> str:
    return path[len(strip):] if strip and path.startswith(strip) else path


def _plan(m: Manifest, leaves: Leaves, strip: str | None
          ) -> tuple[Header, list[int], dict[str, str], list[str]]:
    """The header, the tensor indices to read, the metadata and what is skipped (and why)."""
    entries: Header = []
    indices: list[int] = []
    skipped: list[str] = []
    seen: dict[str, str] = {}
    for path, i in leaves.tensors.items():
        e = m.tensors[i]
        code = SAFETENSORS_DTYPES.get(e.dtype)
        if code is None:
            skipped.append(f"{path} ({e.dtype}: no safetensors dtype)")
            continue
        key = _key(path, strip)
        if key in seen:
            raise ExportError(f"two tensors export under the same key {key!r} ({seen[key]!r} "
                              f"and {path!r}); choose another strip prefix or paths "
                              "(--strip-prefix, --paths)")
        seen[key] = path
        shape = [] if e.container == "numpy-scalar" else list(e.shape)
        entries.append((key, code, shape, entry_nbytes(e)))
        indices.append(i)
    metadata = {"format": "pt", "ckptstore.commit": m.id}
    for path, v in leaves.values.items():
        key = _key(path, strip)
        text = None if isinstance(v, bytes) else json.dumps(v, allow_nan=True)
        if text is None or len(text) > MAX_METADATA_VALUE or key in metadata:
            skipped.append(f"{path} (plain value: bytes, longer than {MAX_METADATA_VALUE} "
                           "characters as JSON, or a clashing key)")
            continue
        metadata[key] = text
    return entries, indices, metadata, skipped


def to_safetensors(store: Store | Repository, ref: str, file: str | os.PathLike[str],
                   paths: Sequence[str] | None = None, strip_prefix: str | None = None,
                   overwrite: bool = False, progress: bool = False) -> ExportResult:
    """Write the tensors of a commit to a local safetensors file, a batch at a time.

    Keys are dotted paths; dtypes are kept (bfloat16 and float8 included; tied tensors are
    written once per path). Plain values (step, lr, ...) go into ``__metadata__`` as JSON
    strings when short, with ``format: pt`` and ``ckptstore.commit``; entries safetensors cannot
    hold are skipped and listed in the result.

    Parameters
    ----------
    store
        A :class:`~ckptstore.store.Store` or its ``repo``.
    ref
        Branch, tag, commit id or unique prefix, with ``~N`` / ``^``.
    file
        The output file (local path).
    paths
        Globs as in ``checkout(paths=...)``: only the entries they select.
    strip_prefix
        Removed from the front of keys (``"model."`` for a model-only file).
    overwrite
        Replace ``file`` if it exists.
    progress
        Show a progress bar (bytes written) on stderr.

    Raises
    ------
    ExportError
        The file exists (without ``overwrite``), its folder is missing, or two tensors would get
        the same key.
    """
    repo = store if isinstance(store, Repository) else store.repo
    file = target_path(file)
    _check_target(file, overwrite)
    m = repo.manifest(repo.resolve(ref))
    entries, indices, metadata, skipped = _plan(m, Leaves.of(m).select(paths), strip_prefix)
    with bar(sum(n for *_, n in entries), "export", progress) as shown:
        hosts = (tensor_to_host(as_tensor(t)) for t in read_tensors(repo, m, indices))
        size = write_safetensors(file, entries, metadata,
                                 zip([key for key, *_ in entries], hosts), shown.update)
    return ExportResult(file=file, commit=m.id, tensors=len(entries), nbytes=size,
                        metadata_keys=tuple(sorted(metadata)), skipped=tuple(skipped))
