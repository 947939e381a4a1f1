"""Hostile-import campaign (issue 26): randomized crafted sources thrown at the Python API
(``import_checkpoint``) and at ``ckpt import``, each in a forked process with a timeout.

Kinds: ``dcp-layout`` (chunk layouts: gaps, overlaps, duplicates, chunks outside, sizes inflated
to tens of GiB, wrong dtypes), ``dcp-path`` (``relative_path`` leaving the folder, absolute,
symlinked out, a FIFO, /dev/zero), ``dcp-odd`` (odd ``.metadata`` objects and pickle streams),
``dcp-bytes`` (random byte mutations of a real DCP folder), ``safetensors`` (crafted headers
and byte mutations), ``torch`` (mutated torch.save zip and legacy files, deflate bombs),
``hf`` (Hugging Face folders: index files, shards and config, paths leaving the folder).

Per trial the outcome is: refused (a ckptstore error), read (and equal to what it must be), or a
failure: ``silent`` (read, but not the data the source holds, or read where it must be refused),
``raw`` (an exception that is not a ckptstore error), ``hang`` (past the timeout), ``crash``
(the process died). Where the truth is not known by construction (byte mutations) a read is
compared with an independent reader: DCP's own loader (metadata through ckptstore's restricted
unpickler) into NaN- and zero-filled targets, ``safetensors.torch.load``, ``torch.load``.
Usage::

    .venv/bin/python benchmarks/hostile_imports.py --count 200 --seed 0
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing as mp
import os
import pickle
import random
import shutil
import struct
import sys
import tempfile
import traceback
from collections import OrderedDict
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reliability import Tally  # noqa: E402

KINDS = ("dcp-layout", "dcp-path", "dcp-odd", "dcp-bytes", "safetensors", "torch", "hf")
TIMEOUT_S = 60.0


# -- building sources ---------------------------------------------------------------------------
def write_dcp(folder: str, tensors: dict, values: dict | None = None,
              relpath: str = "__0_0.distcp", planner_data: Any = None) -> None:
    """A DCP folder written chunk by chunk: ``tensors[fqn] = (size, dtype, [(offsets, sizes,
    content)])`` (each chunk's bytes are ``torch.save(content)``, as FileSystemWriter's)."""
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata,
                                                       ChunkStorageMetadata, Metadata,
                                                       MetadataIndex, TensorProperties,
                                                       TensorStorageMetadata)

    os.makedirs(folder, exist_ok=True)
    data, storage, entries = io.BytesIO(), {}, {}
    for fqn, (size, dtype, chunks) in tensors.items():
        metas = []
        for offsets, sizes, content in chunks:
            start = data.tell()
            torch.save(content, data)
            storage[MetadataIndex(fqn, torch.Size(offsets))] = _StorageInfo(
                relpath, start, data.tell() - start)
            metas.append(ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)))
        entries[fqn] = TensorStorageMetadata(TensorProperties(dtype=dtype), torch.Size(size),
                                             metas)
    for fqn, value in (values or {}).items():
        start = data.tell()
        torch.save(value, data)
        storage[MetadataIndex(fqn)] = _StorageInfo(relpath, start, data.tell() - start)
        entries[fqn] = BytesStorageMetadata()
    meta = Metadata(entries, planner_data=planner_data, storage_data=storage)
    with open(os.path.join(folder, ".metadata"), "wb") as f:
        pickle.dump(meta, f)
    target = relpath if os.path.isabs(relpath) else os.path.join(folder, relpath)
    with open(target, "wb") as f:
        f.write(data.getvalue())


def _grid(rng: random.Random, shape: list[int]) -> list[tuple[list[int], list[int]]]:
    cuts = [sorted({0, n, *(rng.randrange(1, n) for _ in range(rng.randrange(3)) if n > 1)})
            for n in shape]
    boxes: list[tuple[list[int], list[int]]] = [([], [])]
    for c in cuts:
        boxes = [(o + [a], s + [b - a]) for o, s in boxes for a, b in zip(c, c[1:])]
    return boxes


def _tiles(shape: list[int], boxes: list) -> bool:
    """The brute-force truth: every box inside, distinct boxes cover each element once."""
    import numpy as np

    if any(o + z > n for b in boxes for o, z, n in zip(*b, shape)):
        return False
    cover = np.zeros(shape, np.int64)
    for o, z in {(tuple(o), tuple(z)) for o, z in boxes}:
        cover[tuple(slice(a, a + b) for a, b in zip(o, z))] += 1
    return bool((cover == 1).all())


def build_dcp_layout(rng: random.Random, d: str) -> dict:
    import torch

    shape = [rng.randint(1, 9) for _ in range(rng.choice((1, 2, 2, 3)))]
    ref = torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float32).reshape(shape) / 3
    boxes = _grid(rng, shape)
    how = rng.choice(("none", "duplicate", "drop", "shift", "grow", "outside", "inflate",
                      "empty", "dtype"))
    k = rng.randrange(len(boxes))
    o, z = boxes[k]
    a = rng.randrange(len(shape))
    size, dtype = list(shape), torch.float32
    if how == "duplicate":
        boxes.append((list(o), list(z)))
    elif how == "drop" and len(boxes) > 1:
        boxes.pop(k)
    elif how == "shift":
        boxes[k] = ([v + (i == a) * rng.choice((-1, 1)) for i, v in enumerate(o)], z)
    elif how == "grow":
        boxes[k] = (o, [v + (i == a) for i, v in enumerate(z)])
    elif how == "outside":
        boxes.append(([100] * len(shape), list(z)))
    elif how == "inflate":
        size = [1 << 17] * len(shape)
        boxes = [([0] * len(shape), list(size))]
    elif how == "empty":  # at the far corner: DCP keys a chunk's bytes by its offsets
        boxes.append((list(shape), [0] * len(shape)))
    elif how == "dtype":
        dtype = torch.float64
    valid = how != "inflate" and how != "dtype" and min(min(b[0]) for b in boxes) >= 0 \
        and _tiles(shape, boxes)
    chunks = []
    for bo, bz in boxes:
        inside = all(x >= 0 and x + y <= n for x, y, n in zip(bo, bz, shape))
        small = [min(y, 4) for y in bz]
        content = ref[tuple(slice(x, x + y) for x, y in zip(bo, bz))].clone() if inside \
            else torch.rand(small if how == "inflate" else [max(y, 0) for y in bz])
        chunks.append((bo, bz, content))
    write_dcp(os.path.join(d, "src"), {"w": (size, dtype, chunks)}, {"step": 7})
    return {"format": "dcp", "expect": "data" if valid else "refuse",
            "data": {"w": ref, "step": 7}, "detail": f"{how} {shape} {boxes}"[:300]}


def build_dcp_path(rng: random.Random, d: str) -> dict:
    import torch

    src = os.path.join(d, "src")
    how = rng.choice(("dotdot", "absolute", "symlink", "fifo", "devzero"))
    chunks = [([0], [4], torch.ones(4))]
    if how in ("dotdot", "absolute"):
        rel = "../outside.distcp" if how == "dotdot" else os.path.join(d, "outside.distcp")
        write_dcp(src, {"w": ([4], torch.float32, chunks)}, relpath=rel)
        if how == "dotdot":
            shutil.move(os.path.join(src, rel), os.path.join(d, "outside.distcp"))
    else:
        write_dcp(src, {"w": ([4], torch.float32, chunks)})
        data = os.path.join(src, "__0_0.distcp")
        if how == "symlink":
            shutil.move(data, os.path.join(d, "outside.distcp"))
            os.symlink(os.path.join(d, "outside.distcp"), data)
        elif how == "fifo":
            os.unlink(data)
            os.mkfifo(data)
        else:
            os.unlink(data)
            os.symlink("/dev/zero", data)
    return {"format": "dcp", "expect": "refuse", "detail": how}


def _odd_metadata(rng: random.Random, src: str) -> bytes:
    """Bytes of an odd .metadata: odd objects, odd pickle streams, or DCP's records with odd
    fields (edited from a real one)."""
    import torch

    meta = pickle.loads(open(os.path.join(src, ".metadata"), "rb").read())  # our own file
    info = next(iter(meta.storage_data.values()))
    choices = {
        "ordereddict": lambda: pickle.dumps(OrderedDict(a=1)),
        "int": lambda: pickle.dumps(rng.randrange(10**6)),
        "list": lambda: pickle.dumps([meta.state_dict_metadata]),
        "protocol": lambda: bytes([0x80, rng.randrange(6, 256)]) + pickle.dumps(1)[2:],
        "extension": lambda: b"\x80\x04" + bytes([rng.choice((0x82, 0x83, 0x84))]) + b"\x01\x00"
        b"\x00\x00.",
        "length": lambda: b"\x80\x04\x8e" + struct.pack("<Q", 10 ** rng.randint(9, 18)) + b"x.",
        "nested-lists": lambda: b"\x80\x04" + b"]" * 200_000 + b"a" * 199_999 + b".",
        "deep-planner-data": lambda: _edited(meta, planner_data={
            next(iter(meta.state_dict_metadata)): [f"k{i}" for i in range(10 ** 5)]}),
        "planner-clash": lambda: _edited(meta, planner_data={
            k: ["x"] for k in meta.state_dict_metadata}),
        "negative-offset": lambda: _set(meta, info, "offset", -rng.randrange(1, 10**6)),
        "huge-length": lambda: _set(meta, info, "length", 10 ** rng.randint(10, 18)),
        "path-type": lambda: _set(meta, info, "relative_path", 17),
        "transforms": lambda: _set(meta, info, "transform_descriptors", ["zstd"]),
        "dtype-string": lambda: _each_tensor(meta, lambda m: setattr(m.properties, "dtype", "f")),
        "negative-size": lambda: _each_tensor(meta, lambda m: setattr(
            m, "size", torch.Size([-3, 4]))),
        "no-storage": lambda: _edited(meta, storage_data={}),
        "storage-not-dict": lambda: _edited(meta, storage_data=[1, 2]),
    }
    return choices[rng.choice(sorted(choices))]()


def _edited(meta: Any, **fields: Any) -> bytes:
    for k, v in fields.items():
        setattr(meta, k, v)
    return pickle.dumps(meta)


def _set(meta: Any, obj: Any, field: str, value: Any) -> bytes:
    setattr(obj, field, value)
    return pickle.dumps(meta)


def _each_tensor(meta: Any, edit: Any) -> bytes:
    for m in meta.state_dict_metadata.values():
        if hasattr(m, "chunks"):
            edit(m)
    return pickle.dumps(meta)


def _real_dcp(src: str) -> dict:
    import torch
    import torch.distributed.checkpoint as dcp

    state = {"w": torch.randn(6, 5), "b": torch.arange(7), "opt": {"lr": 0.5, "n": [1, 2]}}
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, storage_writer=dcp.FileSystemWriter(src), no_dist=True)
    return state


def build_dcp_odd(rng: random.Random, d: str) -> dict:
    src = os.path.join(d, "src")
    _real_dcp(src)
    raw = _odd_metadata(rng, src)
    with open(os.path.join(src, ".metadata"), "wb") as f:
        f.write(raw)
    return {"format": "dcp", "expect": "refuse", "detail": "odd metadata"}


def _mutate(rng: random.Random, data: bytes, lo: int = 0, hi: int | None = None) -> bytes:
    hi = len(data) if hi is None else min(hi, len(data))
    b = bytearray(data)
    how = rng.choice(("flip", "truncate", "overwrite", "insert"))
    if how == "truncate" or hi <= lo:
        return bytes(b[: rng.randrange(len(b) + 1)])
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(lo, hi)
        if how == "flip":
            b[i] ^= 1 << rng.randrange(8)
        elif how == "overwrite":
            b[i:i + 8] = struct.pack("<Q", rng.choice((0, 2**63 - 1, rng.randrange(2**64))))
        else:
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    return bytes(b)


def _mutate_file(rng: random.Random, path: str, lo: int = 0, hi: int | None = None) -> None:
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(_mutate(rng, data, lo, hi))


def build_dcp_bytes(rng: random.Random, d: str) -> dict:
    src = os.path.join(d, "src")
    _real_dcp(src)
    name = rng.choice((".metadata", "__0_0.distcp"))
    _mutate_file(rng, os.path.join(src, name))
    return {"format": "dcp", "expect": "declared", "detail": f"bytes of {name}"}


def build_safetensors(rng: random.Random, d: str) -> dict:
    import torch
    from safetensors.torch import save_file

    src = os.path.join(d, "src.safetensors")
    save_file({"w": torch.randn(3, 4), "b": torch.arange(5)}, src, metadata={"k": "v"})
    with open(src, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    how = rng.choice(("bytes", "header-bytes", "field", "length"))
    if how == "bytes":
        raw = _mutate(rng, raw)
    elif how == "header-bytes":
        raw = _mutate(rng, raw, 8, 8 + n)
    elif how == "length":
        raw = struct.pack("<Q", rng.choice((0, 1, n + 1, n - 1, 2**63, rng.randrange(2**64)))) \
            + raw[8:]
    else:
        key = rng.choice(("w", "b"))
        field = rng.choice(("dtype", "shape", "data_offsets"))
        header[key][field] = rng.choice((
            "F33", "I64", [-1, 4], [3, 400], [0, 10**12], [48, 0], [2**63, 2**64], None, {},
            "x" * 1000, [3, 4, 5, 6], [1] * 100))
        body = json.dumps(header).encode()
        raw = struct.pack("<Q", len(body)) + body + raw[8 + n:]
    with open(src, "wb") as f:
        f.write(raw)
    return {"format": "safetensors", "expect": "declared", "detail": how}


def build_torch(rng: random.Random, d: str) -> dict:
    import zipfile

    import torch

    src = os.path.join(d, "src.pt")
    buf = io.BytesIO()
    torch.save({"w": torch.randn(3, 4), "step": 3, "names": ["a", "b"]}, buf)
    how = rng.choice(("bytes", "record", "legacy", "deflate"))
    if how == "deflate":  # 4 MiB of zeros in a few KiB: a bomb torch.load would inflate
        plain, out = io.BytesIO(), io.BytesIO()
        torch.save({"w": torch.zeros(2**20)}, plain)
        with zipfile.ZipFile(io.BytesIO(plain.getvalue())) as zin, \
                zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
            for item in zin.infolist():
                zout.writestr(item.filename, zin.read(item))
        raw = out.getvalue()
    elif how == "bytes":
        raw = _mutate(rng, buf.getvalue())
    elif how == "legacy":
        legacy = io.BytesIO()
        torch.save({"w": torch.randn(3, 4)}, legacy, _use_new_zipfile_serialization=False)
        raw = _mutate(rng, legacy.getvalue())
    else:
        out = io.BytesIO()
        with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as zin, \
                zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
            victim = rng.choice(zin.namelist())
            for item in zin.infolist():
                data = zin.read(item)
                if item.filename == victim:
                    if rng.random() < 0.3:
                        continue
                    data = _mutate(rng, data)
                zout.writestr(item, data)
        raw = out.getvalue()
    with open(src, "wb") as f:
        f.write(raw)
    return {"format": "torch", "expect": "declared", "detail": how}


def build_hf(rng: random.Random, d: str) -> dict:
    import torch
    from safetensors.torch import save_file

    src = os.path.join(d, "src")
    os.makedirs(src)
    a, b = {"x.w": torch.randn(3, 4)}, {"y.w": torch.arange(6)}
    save_file(a, os.path.join(src, "s1.safetensors"))
    save_file(b, os.path.join(src, "s2.safetensors"))
    config = {"model_type": "bert", "hidden": 4}
    weight_map = {"x.w": "s1.safetensors", "y.w": "s2.safetensors"}
    index: Any = {"metadata": {}, "weight_map": weight_map}
    how = rng.choice(("valid", "dotdot", "absolute", "symlink", "fifo", "index-bytes",
                      "weight-map-type", "missing-file", "duplicate", "missing-tensor",
                      "config-bytes", "config-list"))
    config_raw: bytes = json.dumps(config).encode()
    outside = os.path.join(d, "outside.safetensors")
    save_file({"secret": torch.ones(2)}, outside)
    if how == "dotdot":
        weight_map["y.w"] = "../outside.safetensors"
    elif how == "absolute":
        weight_map["y.w"] = outside
    elif how == "symlink":
        os.unlink(os.path.join(src, "s2.safetensors"))
        os.symlink(outside, os.path.join(src, "s2.safetensors"))
    elif how == "fifo":
        os.unlink(os.path.join(src, "s2.safetensors"))
        os.mkfifo(os.path.join(src, "s2.safetensors"))
    elif how == "weight-map-type":
        index["weight_map"] = rng.choice((["s1.safetensors"], {"x.w": 3}, None, "s1", {}))
    elif how == "missing-file":
        weight_map["y.w"] = "s3.safetensors"
    elif how == "duplicate":
        save_file({"x.w": torch.zeros(3, 4), "y.w": b["y.w"]},
                  os.path.join(src, "s2.safetensors"))
    elif how == "missing-tensor":
        weight_map["z.w"] = "s1.safetensors"
    elif how == "config-list":
        config_raw = b"[1, 2]"
    raw_index = json.dumps(index).encode()
    if how == "index-bytes":
        raw_index = _mutate(rng, raw_index)
    elif how == "config-bytes":
        config_raw = _mutate(rng, config_raw)
    with open(os.path.join(src, "config.json"), "wb") as f:
        f.write(config_raw)
    with open(os.path.join(src, "model.safetensors.index.json"), "wb") as f:
        f.write(raw_index)
    if how == "valid":
        return {"format": "hf", "expect": "data",
                "data": {"model": {**a, **b}, "config": config_raw.decode()}, "detail": how}
    expect = "declared" if how in ("index-bytes", "config-bytes") else "refuse"
    return {"format": "hf", "expect": expect, "detail": how}


BUILDERS = {"dcp-layout": build_dcp_layout, "dcp-path": build_dcp_path, "dcp-odd": build_dcp_odd,
            "dcp-bytes": build_dcp_bytes, "safetensors": build_safetensors,
            "torch": build_torch, "hf": build_hf}


# -- one trial, in a forked process -------------------------------------------------------------
def same(a: Any, b: Any) -> bool:
    """Equal values: tensors bit for bit (dtype and shape too), containers recursively."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.view(torch.uint8) if a.numel() else a,
                                b.view(torch.uint8) if b.numel() else b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _oracle(case: dict, source: str) -> Any:
    """What an independent reader finds in the source; None when it refuses or is unsure."""
    import torch

    fmt = case["format"]
    try:
        if fmt == "safetensors":
            from safetensors.torch import load
            with open(source, "rb") as f:
                return {"model": load(f.read())}
        if fmt == "torch":
            with open(source, "rb") as f:
                return torch.load(io.BytesIO(f.read()), weights_only=True)
        if fmt == "dcp":
            return _dcp_oracle(source)
    except Exception:
        return None
    return None


def _dcp_oracle(source: str) -> Any:
    """DCP's own loader (metadata through the restricted unpickler) into NaN- and zero-filled
    targets; the flat state if both agree, keyed as ckptstore nests it."""
    import warnings

    import torch
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.metadata import StorageMeta, TensorStorageMetadata

    from ckptstore.importing import read_dcp_metadata
    from ckptstore.importing.dcp_dir import _nest

    class Reader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            m = read_dcp_metadata(self.path)
            m.storage_meta = StorageMeta()
            m.storage_meta.load_id = self.load_id
            return m

    meta = read_dcp_metadata(source)
    if sum(md.size.numel() for md in meta.state_dict_metadata.values()
           if isinstance(md, TensorStorageMetadata)) > 1 << 24:
        return None
    filled = []
    for fill in (float("nan"), 0):
        flat = {k: torch.full(md.size, fill).to(md.properties.dtype)
                if isinstance(md, TensorStorageMetadata) else None
                for k, md in meta.state_dict_metadata.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp_load(flat, storage_reader=Reader(source), no_dist=True)
        filled.append(flat)
    if not same(*filled):
        return None
    paths = meta.planner_data if isinstance(meta.planner_data, dict) else {}
    return _nest(filled[0], {k: tuple(v) for k, v in paths.items()})


def trial(case: dict, d: str, via: str, conn: Any) -> None:
    """Import ``case`` through ``via`` ("api" or "cli"); send ``(outcome, detail)``."""
    try:
        import torch

        torch.set_num_threads(1)
        import ckptstore
        from ckptstore.cli import main
        from ckptstore.errors import CkptStoreError
        from ckptstore.importing import import_checkpoint

        source = os.path.join(d, "src.safetensors" if case["format"] == "safetensors" else
                              "src.pt" if case["format"] == "torch" else "src")
        url = os.path.join(d, f"store-{via}")
        try:
            if via == "api":
                import_checkpoint(ckptstore.open(url), source, format=case["format"])
            else:
                os.environ["CKPT_TRACEBACK"] = "1"  # anything but a ckptstore error propagates
                sys.stderr = io.StringIO()
                os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # "imported ..." is not our output
                if main(["import", url, source, "--format", case["format"]]) != 0:
                    raise AssertionError("ckpt import failed without raising")
        except CkptStoreError as e:
            valid = case["expect"] == "data"  # a source known to be good must be read
            conn.send(("refused-valid" if valid else "refused", f"{type(e).__name__}: {e}"[:200]))
            return
        except BaseException as e:  # noqa: BLE001 - counting what escapes is the point
            conn.send(("raw", f"{type(e).__name__}: {e}"[:300]))
            return
        got = ckptstore.open(url).checkout()
        if case["expect"] == "refuse":
            conn.send(("silent", "read a source that must be refused"))
        elif case["expect"] == "data":
            conn.send(("read", "") if same(got, case["data"]) else ("silent", "data differ"))
        else:
            oracle = _oracle(case, source)
            if case["format"] == "hf":
                conn.send(("read", "declared (mutated but valid)"))
            elif oracle is None:
                conn.send(("read-unverified", "the independent reader refused or was unsure"))
            elif same(got if case["format"] != "safetensors" else {"model": got["model"]},
                      oracle):
                conn.send(("read", ""))
            else:
                conn.send(("silent", "differs from the independent reader"))
    except BaseException as e:  # noqa: BLE001
        conn.send(("raw", "in the harness: " + "".join(traceback.format_exception(e))[-300:]))


def run_one(case: dict, d: str, via: str, timeout: float = TIMEOUT_S) -> tuple[str, str]:
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=trial, args=(case, d, via, send))
    p.start()
    ready = recv.poll(timeout)
    if not ready:
        p.kill()
        p.join()
        return "hang", f"no answer in {timeout:.0f} s"
    try:
        outcome = recv.recv()
    except EOFError:
        outcome = None
    p.join(10)
    if outcome is None:
        return "crash", f"exit status {p.exitcode}"
    return outcome


FAILURES = ("silent", "raw", "hang", "crash")


def campaign(count: int, seed: int) -> dict:
    """``count`` hostile imports (kinds in turn, each through the API and ``ckpt import``)."""
    import torch

    torch.set_num_threads(1)  # forked children then never wait on a parent's thread pool
    import ckptstore.importing  # noqa: F401 - imported once, before the forks

    rng = random.Random(seed)
    tally = Tally("hostile-imports")
    counts = {k: 0 for k in FAILURES}
    root = tempfile.mkdtemp(prefix="ckpt-hostile-")
    try:
        for i in range(count):
            kind = KINDS[i % len(KINDS)]
            d = os.path.join(root, str(i))
            os.makedirs(d)
            case = BUILDERS[kind](random.Random(rng.randrange(2**32)), d)
            via = "api" if (i // len(KINDS)) % 2 == 0 else "cli"
            outcome, detail = run_one(case, d, via)
            if outcome in counts:
                counts[outcome] += 1
            tally.add(outcome not in (*FAILURES, "refused-valid"), f"{kind}:{outcome}",
                      f"#{i} {kind} via {via} ({case['detail']}): {detail}")
            shutil.rmtree(d, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {**tally.summary(), **counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=140)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(campaign(args.count, args.seed), indent=2))


if __name__ == "__main__":
    main()
