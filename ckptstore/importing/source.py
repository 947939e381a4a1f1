"""What every import reader shares: its error, files confined to the source folder, regular files
only, byte ranges checked against the file, and ``torch.load(weights_only=True)`` of untrusted
bytes with every failure turned into that error."""

from __future__ import annotations

import io
import json
import os
import pickle
import stat
import zipfile
from typing import IO, Any

from ..errors import ImportSourceError

__all__ = ["ImportSourceError", "inside", "load_torch", "open_regular", "parse_json",
           "read_json", "read_range", "read_text"]


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def inside(root: str, name: object, what: str) -> str:
    """The real path of ``name`` (relative to the folder ``root``), refused unless it stays in
    ``root`` once every ``..``, absolute path and symlink is resolved."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise ImportSourceError(f"{what} names {name!r}, which is not a file name")
    try:
        real_root = os.path.realpath(root)
        path = os.path.realpath(os.path.join(real_root, name))
    except (OSError, ValueError) as e:  # a NUL byte in root, a symlink loop
        raise ImportSourceError(f"{what}: cannot resolve {name!r} in {root!r} "
                                f"({_first_line(e)})") from None
    if os.path.commonpath([real_root, path]) != real_root:
        raise ImportSourceError(f"{what} names {name!r}, which leaves the source folder {root}: "
                                "refusing to read outside it")
    return path


def open_regular(path: str, what: str) -> IO[bytes]:
    """``path`` opened for reading, refused unless it is a regular file (a FIFO or a device
    would hang or never end)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError) as e:
        raise ImportSourceError(f"{what}: cannot open {path} ({_first_line(e)})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ImportSourceError(f"{what}: {path} is not a regular file; import reads files only")
    return os.fdopen(fd, "rb")


def read_range(f: IO[bytes], offset: object, length: object, what: str) -> bytes:
    """``length`` bytes of ``f`` from ``offset``, refused unless the file holds all of them."""
    size = os.fstat(f.fileno()).st_size
    if not (type(offset) is int and type(length) is int and 0 <= offset
            and 0 <= length <= size - offset):
        raise ImportSourceError(f"{what}: bytes [{offset!r}, +{length!r}) are not inside its "
                                f"{size}-byte file")
    f.seek(offset)
    data = f.read(length)
    if len(data) != length:
        raise ImportSourceError(f"{what}: the file ended early (it changed while read?)")
    return data


def read_text(path: str, what: str) -> str:
    """The text of a UTF-8 file (a regular one)."""
    with open_regular(path, what) as f:
        raw = f.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ImportSourceError(f"{what}: {path} is not UTF-8 text") from None


def read_json(path: str, what: str) -> Any:
    """The JSON value of a UTF-8 file."""
    return parse_json(read_text(path, what), path, what)


def parse_json(text: str, path: str, what: str) -> Any:
    """The JSON value of ``text`` (read from ``path``)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ImportSourceError(f"{what}: {path} is not valid JSON ({_first_line(e)})") from None


def _stored_records_only(f: IO[bytes], what: str) -> None:
    """Refuse a zip whose records are compressed: torch.save never writes them, and torch.load
    would inflate them (1,000x and more) before anything could check their size."""
    try:
        infos = zipfile.ZipFile(f).infolist() if zipfile.is_zipfile(f) else []
    except Exception:  # noqa: BLE001 - a damaged zip: torch.load reports it below
        infos = []
    f.seek(0)
    if any(i.compress_type != zipfile.ZIP_STORED for i in infos):
        raise ImportSourceError(f"{what} has compressed zip records, which torch.save never "
                                "writes: refusing to inflate them")


def load_torch(source: IO[bytes] | bytes, what: str) -> Any:
    """``torch.load(weights_only=True)`` of untrusted bytes: tensors and plain values only, from
    a zip of stored (uncompressed) records or torch's legacy format."""
    import torch

    f = io.BytesIO(source) if isinstance(source, bytes) else source
    _stored_records_only(f, what)
    try:
        return torch.load(f, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ImportSourceError(
            f"{what} needs pickle to load, or is damaged (torch.load(weights_only=True) refused "
            f"it: {first}); ckptstore never unpickles. Re-save it from trusted code as tensors "
            "and plain values (e.g. torch.save(model.state_dict(), ...)) or as safetensors"
        ) from None
    except Exception as e:  # a parser of untrusted bytes: RuntimeError, TypeError, EOFError ...
        raise ImportSourceError(f"{what} is not a readable torch.save file "
                                f"({_first_line(e)})") from None
