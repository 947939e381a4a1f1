"""A ``torch.distributed.checkpoint`` folder (``FileSystemWriter`` output) read in this process,
as untrusted input, without DCP's loader.

1. ``.metadata`` is read and checked (:mod:`.dcp_metadata`).
2. Each tensor's chunks must tile it exactly, each no larger than its stored bytes
   (:mod:`.dcp_tiling`).
3. Every data file must stay inside the folder and be a regular file; every item's bytes lie
   inside its file, and no two items share bytes. So nothing is allocated beyond what the folder
   holds.
4. Only then are the tensors allocated; each chunk is ``torch.load(weights_only=True)`` of its
   bytes (as DCP itself reads them), and must hold a dense tensor of the chunk's dtype and shape.
   Byte items (plain values) are read the same way.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

import numpy as np
import torch

from .dcp_metadata import DcpBytes, DcpTensor, Storage, read_dcp_layout
from .dcp_tiling import tiling_chunks
from .source import ImportSourceError, inside, load_torch, open_regular, read_range

__all__ = ["read_dcp"]

Read = tuple[Storage, str, int]  # storage, fqn, chunk index (-1: a byte item)


def _plan(items: tuple[DcpTensor | DcpBytes, ...]) -> list[Read]:
    reads: list[Read] = []
    for item in items:
        if isinstance(item, DcpBytes):
            reads.append((item.storage, item.fqn, -1))
            continue
        itemsize = torch.empty((), dtype=item.dtype).element_size()
        reads.extend((item.storage[k], item.fqn, int(k)) for k in tiling_chunks(item, itemsize))
    return reads


def _check_files(directory: str, reads: list[Read]) -> dict[str, str]:
    """Real path of each data file; every read inside its file, no two reads sharing bytes."""
    by_file: dict[str, list[Read]] = defaultdict(list)
    for r in reads:
        by_file[r[0].file].append(r)
    paths = {}
    for name, group in by_file.items():
        paths[name] = path = inside(directory, name, "DCP metadata")
        with open_regular(path, "DCP data") as f:
            size = os.fstat(f.fileno()).st_size
        start = np.array([r[0].offset for r in group], np.int64)
        end = start + np.array([r[0].length for r in group], np.int64)
        if (end > size).any():
            k = int(np.argmax(end > size))
            raise ImportSourceError(f"DCP item {group[k][1]!r}: its bytes end at {end[k]}, past "
                                    f"the end of {name} ({size} bytes)")
        order = np.argsort(start, kind="stable")
        shared = end[order][:-1] > start[order][1:]
        if shared.any():
            a, b = group[order[int(np.argmax(shared))]], group[order[int(np.argmax(shared)) + 1]]
            raise ImportSourceError(f"DCP items {a[1]!r} and {b[1]!r} share bytes of {name}; "
                                    "the checkpoint is damaged or crafted")
    return paths


def _chunk(value: Any, t: DcpTensor, k: int) -> torch.Tensor:
    want = tuple(t.sizes[k].tolist())
    if not (isinstance(value, torch.Tensor) and value.layout == torch.strided
            and value.device.type == "cpu" and value.dtype == t.dtype
            and tuple(value.shape) == want):
        got = (f"a tensor of shape {list(value.shape)} and {value.dtype}"
               if isinstance(value, torch.Tensor) else f"a {type(value).__name__}")
        raise ImportSourceError(f"DCP tensor {t.fqn!r}: the chunk at {t.offsets[k].tolist()} "
                                f"holds {got}, not {list(want)} of {t.dtype}")
    return value


def read_dcp(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The state of a DCP checkpoint directory, read in this process (no process group).

    Raises
    ------
    ImportSourceError
        Malformed metadata, chunks that do not tile their tensor, a file outside the folder or
        not a regular file, bytes that are not what the metadata declares, or a value that
        would need pickle.
    """
    directory = os.fspath(directory)
    layout = read_dcp_layout(directory)
    reads = _plan(layout.items)
    paths = _check_files(directory, reads)
    tensors = {t.fqn: t for t in layout.items if isinstance(t, DcpTensor)}
    flat: dict[str, Any] = {}
    for t in tensors.values():  # bounded: the chunks tile it and the folder holds their bytes
        whole = len(t.sizes) == 1 and tuple(t.sizes[0].tolist()) == t.size and 0 not in t.size
        flat[t.fqn] = None if whole else torch.empty(t.size, dtype=t.dtype)
    by_file: dict[str, list[Read]] = defaultdict(list)
    for r in reads:
        by_file[r[0].file].append(r)
    for name, group in by_file.items():
        with open_regular(paths[name], "DCP data") as f:
            for storage, fqn, k in sorted(group, key=lambda r: r[0].offset):
                what = f"DCP item {fqn!r} in {name}"
                data = read_range(f, storage.offset, storage.length, what)
                if not data.startswith(b"PK\x03\x04"):  # torch.save's zip, as DCP writes
                    raise ImportSourceError(f"{what} is not a torch.save zip record "
                                            "(FileSystemWriter's format)")
                value = load_torch(data, what)
                if k < 0:
                    flat[fqn] = value
                    continue
                t = tensors[fqn]
                chunk = _chunk(value, t, k)
                if flat[fqn] is None:
                    flat[fqn] = chunk
                else:
                    box = tuple(slice(o, o + z) for o, z in zip(t.offsets[k].tolist(),
                                                                t.sizes[k].tolist()))
                    flat[fqn][box].copy_(chunk)
    return _nest(flat, layout.key_paths)


def _nest(flat: dict[str, Any], paths: dict[str, tuple[str | int, ...]]) -> dict[str, Any]:
    """Undo DCP's flattening of nested dicts and lists (``planner_data``: fqn -> key path)."""
    root: dict[Any, Any] = {}
    for fqn, value in flat.items():
        *parents, leaf = paths.get(fqn, (fqn,))
        node = root
        for key in parents:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                break
        if not isinstance(node, dict) or leaf in node:
            raise ImportSourceError(f"DCP metadata: the key path of {fqn!r} clashes with another "
                                    "item's; the checkpoint is damaged or crafted")
        node[leaf] = value

    def lists(node: Any) -> Any:  # depth bounded by MAX_DEPTH
        if not isinstance(node, dict):
            return node
        out = {k: lists(v) for k, v in node.items()}
        if out and all(isinstance(k, int) for k in out) and sorted(out) == list(range(len(out))):
            return [out[i] for i in range(len(out))]
        return out

    return lists(root)
