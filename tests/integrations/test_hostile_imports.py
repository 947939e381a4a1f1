"""Hostile imports (issue 26, items 4, 5 and 9): crafted DCP folders, safetensors headers, torch
zip files and Hugging Face folders. Each is built here from real files written by torch /
safetensors and then edited; each must end in one ``ImportSourceError`` line, commit nothing,
allocate nothing the source does not hold and read nothing outside the source folder."""

from __future__ import annotations

import io
import json
import os
import pathlib
import pickle
import struct
import zipfile
from collections import OrderedDict
from collections.abc import Callable

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

import ckptstore
from ckptstore.cli import main
from ckptstore.errors import ExportError
from ckptstore.export import to_dcp, to_hf_directory, to_safetensors
from ckptstore.importing import ImportSourceError, import_checkpoint, read_dcp, read_source

W = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7


# -- DCP ----------------------------------------------------------------------------------------
def dcp_folder(path: pathlib.Path, state: dict | None = None) -> pathlib.Path:
    """A real DCP checkpoint folder written by torch."""
    state = {"w": W.clone(), "b": torch.ones(5), "step": 3} if state is None else state
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path)), no_dist=True)
    return path


def edit_metadata(folder: pathlib.Path, edit: Callable[[object], object]) -> None:
    """Load the folder's .metadata (written by the test itself: trusted), edit, write back."""
    meta_file = folder / ".metadata"
    meta = pickle.loads(meta_file.read_bytes())
    meta_file.write_bytes(pickle.dumps(edit(meta) or meta))


def set_chunks(fqn: str, chunks: list[tuple[list[int], list[int]]], size: list[int] | None = None
               ) -> Callable[[object], None]:
    """Replace the chunk list of ``fqn`` (each chunk reads the first stored chunk's bytes)."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    def edit(meta) -> None:
        md = meta.state_dict_metadata[fqn]
        if size is not None:
            md.size = torch.Size(size)
        first = next(v for k, v in meta.storage_data.items() if k.fqn == fqn)
        md.chunks = [ChunkStorageMetadata(torch.Size(o), torch.Size(s)) for o, s in chunks]
        for o, _ in chunks:
            meta.storage_data[MetadataIndex(fqn, torch.Size(o))] = first
    return edit


def refused(source: pathlib.Path, match: str, tmp_path: pathlib.Path, fmt: str = "auto") -> None:
    """Importing ``source`` raises ImportSourceError matching ``match`` and commits nothing."""
    store = ckptstore.open(str(tmp_path / "store"))
    with pytest.raises(ImportSourceError, match=match) as info:
        import_checkpoint(store, source, format=fmt)
    assert "\n" not in str(info.value)
    assert store.commit_ids() == []


@pytest.mark.parametrize("chunks, match", [
    ([([100, 100], [3, 4])], "outside"),                       # the issue's chunk
    ([([0, 0], [2, 4])], "do not cover"),                      # a gap: row 2 never read
    ([([0, 0], [2, 4]), ([1, 0], [1, 4])], "overlap|do not cover"),  # volume right, overlap + gap
    ([([0, 0], [3, 4]), ([0, 0], [3, 4]), ([0, 0], [1, 1])], "overlap|do not cover"),
], ids=["outside", "gap", "overlap-and-gap", "duplicate-plus-overlap"])
def test_dcp_chunks_that_do_not_tile_the_tensor_are_refused(tmp_path, chunks, match) -> None:
    src = dcp_folder(tmp_path / "dcp")
    edit_metadata(src, set_chunks("w", chunks))
    refused(src, match, tmp_path)


def _tensor(size: list[int], boxes: list[tuple[list[int], list[int]]]):
    import numpy as np

    from ckptstore.importing.dcp_metadata import DcpTensor, Storage
    return DcpTensor("w", tuple(size), torch.float32, np.array([b[0] for b in boxes]),
                     np.array([b[1] for b in boxes]),
                     tuple(Storage("f", 0, 1 << 40) for _ in boxes))


def test_tiling_of_a_large_sharding_grid_and_of_many_dimensions() -> None:
    from ckptstore.importing.dcp_tiling import tiling_chunks

    grid = [([i * 4, j * 4], [4, 4]) for i in range(64) for j in range(64)]
    assert len(tiling_chunks(_tensor([256, 256], grid), 4)) == 4096
    grid[100] = ([grid[100][0][0] + 1, grid[100][0][1]], [4, 4])
    with pytest.raises(ImportSourceError, match="overlap|outside"):
        tiling_chunks(_tensor([256, 256], grid), 4)
    seven = [([i] + [0] * 6, [1] + [2] * 6) for i in range(2)]  # 7 dims: the pair sweep
    assert len(tiling_chunks(_tensor([2] * 7, seven), 4)) == 2
    seven = [([0] * 7, [2] * 6 + [1]), ([0] * 7, [1] + [2] * 6)]  # 64 + 64 of 128: overlap
    with pytest.raises(ImportSourceError, match="overlaps another"):
        tiling_chunks(_tensor([2] * 7, seven), 4)


def test_dcp_identical_duplicate_chunks_are_read_once(tmp_path) -> None:
    src = dcp_folder(tmp_path / "dcp")
    edit_metadata(src, set_chunks("w", [([0, 0], [3, 4]), ([0, 0], [3, 4])]))
    assert torch.equal(read_dcp(src)["w"], W)


def test_dcp_declared_size_beyond_the_source_is_refused_before_allocating(tmp_path) -> None:
    src = dcp_folder(tmp_path / "dcp")  # 12 GiB declared, a few hundred bytes stored
    edit_metadata(src, set_chunks("w", [([0, 0], [49152, 65536])], size=[49152, 65536]))
    refused(src, "holds only", tmp_path)


def test_dcp_chunk_whose_bytes_hold_another_shape_is_refused(tmp_path) -> None:
    src = dcp_folder(tmp_path / "dcp", {"w": W.clone(), "v": torch.ones(2, 2)})
    edit_metadata(src, set_chunks("v", [([0, 0], [2, 2])]))  # fine so far ...

    def swap(meta):  # ... now v's chunk points at w's bytes (3x4)
        from torch.distributed.checkpoint.metadata import MetadataIndex
        meta.storage_data[MetadataIndex("v", torch.Size([0, 0]))] = \
            meta.storage_data[MetadataIndex("w", torch.Size([0, 0]))]
    edit_metadata(src, swap)
    refused(src, "holds a tensor of shape|share bytes", tmp_path)


@pytest.mark.parametrize("where", ["../other/__0_0.distcp", "ABSOLUTE"])
def test_dcp_relative_path_leaving_the_folder_is_refused(tmp_path, where) -> None:
    src = dcp_folder(tmp_path / "dcp")
    other = tmp_path / "other"
    other.mkdir()
    (other / "__0_0.distcp").write_bytes((src / "__0_0.distcp").read_bytes())
    target = str(other / "__0_0.distcp") if where == "ABSOLUTE" else where

    def point_out(meta):
        for info in meta.storage_data.values():
            info.relative_path = target
    edit_metadata(src, point_out)
    refused(src, "leaves", tmp_path)


def test_dcp_symlink_out_of_the_folder_is_refused(tmp_path) -> None:
    src = dcp_folder(tmp_path / "dcp")
    data = src / "__0_0.distcp"
    (tmp_path / "elsewhere.distcp").write_bytes(data.read_bytes())
    data.unlink()
    data.symlink_to(tmp_path / "elsewhere.distcp")
    refused(src, "leaves", tmp_path)


def _pickle_with(body: bytes) -> bytes:
    return b"\x80\x04" + body + b"."


@pytest.mark.parametrize("content, match", [
    (pickle.dumps(OrderedDict(a=1)), "not DCP's Metadata"),
    (pickle.dumps(7), "not DCP's Metadata"),
    (b"\x80\x63" + pickle.dumps(7)[2:], "not a readable DCP metadata"),      # protocol 99
    (_pickle_with(b"\x82\x01"), "not a readable DCP metadata"),              # EXT1 opcode
    (_pickle_with(b"\x8e" + struct.pack("<Q", 10**12) + b"x"), "not a readable DCP metadata"),
    (b"", "not a readable DCP metadata"),
], ids=["ordereddict", "int", "protocol-99", "extension-opcode", "1e12-length", "empty"])
def test_odd_dcp_metadata_files_are_refused(tmp_path, content, match) -> None:
    src = tmp_path / "dcp"
    src.mkdir()
    (src / ".metadata").write_bytes(content)
    refused(src, match, tmp_path)


def test_deep_planner_data_is_refused(tmp_path) -> None:
    src = dcp_folder(tmp_path / "dcp")

    def deep(meta):
        meta.planner_data = {"w": [f"k{i}" for i in range(100_000)]}
    edit_metadata(src, deep)
    refused(src, "nested", tmp_path)


def test_cli_import_of_a_bad_dcp_folder_prints_one_line(tmp_path, capsys) -> None:
    src = dcp_folder(tmp_path / "dcp")
    edit_metadata(src, set_chunks("w", [([0, 0], [3, 4]), ([1, 1], [1, 1])]))
    url = str(tmp_path / "store")
    assert main(["import", url, str(src)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "overlap" in err
    assert ckptstore.open(url).commit_ids() == []


def test_a_fifo_as_dcp_data_is_refused_without_hanging(tmp_path) -> None:
    src = dcp_folder(tmp_path / "dcp")
    (src / "__0_0.distcp").unlink()
    os.mkfifo(src / "__0_0.distcp")
    refused(src, "not a regular file", tmp_path)


# -- safetensors --------------------------------------------------------------------------------
def safetensors_bytes(header: object, data: bytes = b"\0" * 48, length: int | None = None
                      ) -> bytes:
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(head) if length is None else length) + head + data


GOOD = {"w": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]}}
HEADERS = {
    "empty-file": b"",
    "short-file": b"\x08\0\0",
    "length-beyond-file": safetensors_bytes(GOOD, length=10_000),
    "length-2**63": safetensors_bytes(GOOD, length=2**63),
    "not-json": safetensors_bytes(b"{not json at all"),
    "not-utf8": safetensors_bytes(b'{"\xff\xfe": 1}'),
    "json-list": safetensors_bytes([1, 2, 3]),
    "offsets-beyond-data": safetensors_bytes(
        {"w": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 4800]}}),
    "offsets-vs-shape": safetensors_bytes(
        {"w": {"dtype": "F32", "shape": [30, 4], "data_offsets": [0, 48]}}),
    "unknown-dtype": safetensors_bytes(
        {"w": {"dtype": "F33", "shape": [3, 4], "data_offsets": [0, 48]}}),
    "negative-shape": safetensors_bytes(
        {"w": {"dtype": "F32", "shape": [-3, 4], "data_offsets": [0, 48]}}),
    "metadata-not-strings": safetensors_bytes({**GOOD, "__metadata__": {"a": 1}}),
}


def test_a_safetensors_header_length_starting_with_0x80_is_still_safetensors(tmp_path) -> None:
    for pad in range(0, 200, 4):  # one of these header lengths has 0x80 as its low byte
        src = tmp_path / f"x{pad}.safetensors"
        save_file({"w": W.clone()}, str(src), metadata={"k": "v" * pad})
        if src.read_bytes()[0] == 0x80:
            assert read_source(src)[2] == "safetensors"
            return
    pytest.fail("no header of length 0x..80 was produced")


@pytest.mark.parametrize("name", sorted(HEADERS))
def test_hostile_safetensors_headers_are_refused(tmp_path, name) -> None:
    src = tmp_path / "x.safetensors"
    src.write_bytes(HEADERS[name])
    refused(src, "safetensors", tmp_path, fmt="safetensors")


# -- torch.save zip files -----------------------------------------------------------------------
def torch_zip(tmp_path: pathlib.Path, edit: Callable[[str, bytes], bytes | None]) -> pathlib.Path:
    """A torch.save zip file whose records ``edit`` rewrites (None drops one)."""
    buf = io.BytesIO()
    torch.save({"w": W.clone()}, buf)
    out = tmp_path / "x.pt"
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as zin, \
            zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            data = edit(item.filename, zin.read(item))
            if data is not None:
                zout.writestr(item, data)
    return out


@pytest.mark.parametrize("edit", [
    lambda name, data: data[:10] if name.endswith("/data/0") else data,       # short storage
    lambda name, data: None if name.endswith("/data/0") else data,            # missing storage
    lambda name, data: b"\x80\x02K\x01." if name.endswith("data.pkl") else data,  # an int
    lambda name, data: data[: len(data) // 2] if name.endswith("data.pkl") else data,
    lambda name, data: b"middle" if name.endswith("byteorder") else data,
], ids=["short-storage", "missing-storage", "not-a-dict", "truncated-pickle", "byteorder"])
def test_hostile_torch_zip_files_are_refused(tmp_path, edit) -> None:
    refused(torch_zip(tmp_path, edit), "torch.save|needs pickle|not a mapping", tmp_path,
            fmt="torch")


def test_torch_zip_with_compressed_records_is_refused_before_inflating(tmp_path) -> None:
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(2**20)}, buf)  # 4 MiB of zeros deflate to ~4 KiB
    src = tmp_path / "bomb.pt"
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as zin, \
            zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            zout.writestr(item.filename, zin.read(item))
    assert src.stat().st_size < 2**16
    refused(src, "compressed zip records", tmp_path, fmt="torch")


def test_truncated_torch_zip_is_refused(tmp_path) -> None:
    src = tmp_path / "x.pt"
    torch.save({"w": W.clone()}, src)
    src.write_bytes(src.read_bytes()[:200])
    refused(src, "torch.save", tmp_path, fmt="torch")


# -- Hugging Face folders -----------------------------------------------------------------------
def hf_folder(path: pathlib.Path, index: dict | str | bytes | None = None) -> pathlib.Path:
    path.mkdir()
    (path / "config.json").write_text('{"model_type": "bert"}')
    save_file({"w": W.clone()}, str(path / "model-00001-of-00001.safetensors"))
    if index is not None:
        raw = index if isinstance(index, (str, bytes)) else json.dumps(index)
        mode = "wb" if isinstance(raw, bytes) else "w"
        with open(path / "model.safetensors.index.json", mode) as f:
            f.write(raw)
    return path


@pytest.mark.parametrize("where", ["../outside/x.safetensors", "ABSOLUTE"])
def test_hf_weight_map_leaving_the_folder_is_refused(tmp_path, where) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    save_file({"secret": torch.ones(2)}, str(outside / "x.safetensors"))
    name = str(outside / "x.safetensors") if where == "ABSOLUTE" else where
    src = hf_folder(tmp_path / "hf", {"weight_map": {"secret": name}})
    refused(src, "leaves", tmp_path)


@pytest.mark.parametrize("index, match", [
    ({"weight_map": {"w": "model-00001-of-00001.safetensors"}}, None),
    (b'{"weight_map": {"w": "\xff"}}', "UTF-8"),
    ("{not json", "JSON"),
    ({"metadata": {}}, "weight_map"),
    ({"weight_map": ["a.safetensors"]}, "weight_map"),
    ({"weight_map": {"w": 3}}, "weight_map"),
    ({"weight_map": {"w": "missing.safetensors"}}, "cannot open"),
    ({"weight_map": {"w2": "model-00001-of-00001.safetensors"}}, "does not hold"),
], ids=["good", "not-utf8", "not-json", "no-weight-map", "list", "not-a-name", "missing-file",
        "tensor-not-in-file"])
def test_odd_hf_index_files(tmp_path, index, match) -> None:
    src = hf_folder(tmp_path / "hf", index)
    if match is None:
        state, _, fmt = read_source(src)
        assert fmt == "hf" and torch.equal(state["model"]["w"], W)
    else:
        refused(src, match, tmp_path)


def test_hf_config_that_is_not_utf8_json_is_refused(tmp_path) -> None:
    src = hf_folder(tmp_path / "hf")
    (src / "model.safetensors").write_bytes(
        (src / "model-00001-of-00001.safetensors").read_bytes())
    (src / "config.json").write_bytes(b"\xff\xfe{")
    refused(src, "config.json", tmp_path)


# -- export targets -----------------------------------------------------------------------------
@pytest.mark.parametrize("export", [
    lambda store, out: to_safetensors(store, "main", out + "\0x.safetensors"),
    lambda store, out: to_hf_directory(store, "main", out + "\0x"),
    lambda store, out: to_dcp(store, "main", out + "\0x"),
], ids=["safetensors", "hf", "dcp"])
def test_export_path_with_a_nul_byte_is_an_export_error(tmp_path, export) -> None:
    store = ckptstore.open(str(tmp_path / "store"))
    store.commit({"model": {"w": W.clone()}, "config": "{}"})
    with pytest.raises(ExportError, match="NUL"):
        export(store, str(tmp_path / "out"))



@pytest.mark.slow
def test_the_hostile_import_campaign_finds_nothing() -> None:
    """A short run of benchmarks/hostile_imports.py (every kind twice: API and ckpt import)."""
    import sys
    sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "benchmarks"))
    from hostile_imports import campaign

    result = campaign(14, seed=3)
    assert (result["failed"], result["silent"], result["raw"], result["hang"],
            result["crash"]) == (0, 0, 0, 0, 0), result["failures"]
