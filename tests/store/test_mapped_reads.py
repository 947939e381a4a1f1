"""Chunks of a local store are read, never mapped (``LocalStorage.read_chunk``, issue 26 item
10; they were mapped from 1 MiB before): what a checkout hands back is never the store's pages
(it is writable and stays valid after gc), and a chunk file damaged or truncated while it is
read is a clear error, never a ``SIGBUS`` that ends the process."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

import ckptstore
from ckptstore.format.arrays import ChunkGrid, read_array, start_read_region, write_array
from ckptstore.chunkcodec import RawLossless
from ckptstore.format.dtypes import STORAGE
from ckptstore.errors import CorruptedChunkError
from ckptstore.commit.plan import EncodingOptions
from ckptstore.policy import Policy, QuantSpec
from ckptstore.storage import LocalStorage, open_storage

LARGE = 1 << 20  # chunks this large were mapped before issue 26

ROWS = 5 * 4096 + 7  # 64 float32 a row: 5 MiB, chunks of 2 + 2 + 1 MiB


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return {"emb": torch.randn(ROWS, 64, generator=g),
            "half": torch.randn(ROWS, 64, generator=g).to(torch.bfloat16)}


def _chunks(root: str, min_size: int) -> list[str]:
    out = []
    for folder, _, files in os.walk(os.path.join(root, "data")):
        out += [os.path.join(folder, f) for f in files
                if f != "zarr.json" and os.path.getsize(os.path.join(folder, f)) >= min_size]
    return sorted(out)


@pytest.mark.parametrize("compression", ["entropy", "none", "lz4"])
def test_checkout_of_large_chunks_is_writable_and_outlives_the_store(tmp_path, compression):
    root = str(tmp_path / "s")
    store = ckptstore.open(root, options=EncodingOptions(compression=compression,
                                                  chunk_bytes=1 << 21))
    state = _state()
    first = store.commit(state, message="one")
    assert _chunks(root, LARGE)  # large chunks, mapped before
    got = store.checkout("main")
    into = {"emb": torch.zeros(ROWS, 64), "half": torch.zeros(ROWS, 64, dtype=torch.bfloat16)}
    store.checkout("main", into=into)
    store.commit({"emb": torch.zeros(4)}, message="two")
    store.gc(keep_last=1, grace_period=0)  # the first commit's files are gone
    assert not os.path.exists(os.path.join(root, "data", first.id))
    for k, v in state.items():
        assert torch.equal(got[k], v)
        got[k].add_(1)  # the pages are the checkout's own, not the deleted files'
        assert torch.equal(got[k], v + 1)
    assert all(torch.equal(into[k], state[k]) for k in state)
    store.close()


def test_large_chunk_damage_is_a_corrupted_chunk_error(tmp_path):
    root = str(tmp_path / "s")
    store = ckptstore.open(root, options=EncodingOptions(chunk_bytes=1 << 21))
    store.commit(_state(), message="one")
    first, second = _chunks(root, LARGE)[:2]
    key = os.path.relpath(first, root).replace(os.sep, "/")
    with open(first, "r+b") as f:  # a flipped bit in the middle
        f.seek(os.path.getsize(first) // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x04]))
    with pytest.raises(CorruptedChunkError, match=key):
        store.checkout("main")
    with open(first, "r+b") as f:  # mended; then the second one loses its tail
        f.seek(os.path.getsize(first) // 2)
        f.write(b)
    assert all(torch.equal(v, _state()[k]) for k, v in store.checkout("main").items())
    os.truncate(second, os.path.getsize(second) - 1000)
    key = os.path.relpath(second, root).replace(os.sep, "/")
    with pytest.raises(CorruptedChunkError, match=key):
        store.checkout("main")
    store.close()


def test_large_chunks_of_chains_and_quantized_commits(tmp_path):
    """Chains (XOR and quantized code deltas) and quantized full commits replay from large
    chunks exactly."""
    root = str(tmp_path / "s")
    opts = EncodingOptions(chunk_bytes=1 << 21)
    xor = ckptstore.open(root, options=opts, policy=Policy(delta=True))
    quant = ckptstore.open(str(tmp_path / "q"), options=opts,
                           policy=Policy(quantize=QuantSpec(bits=8), delta=True))
    states = [_state()]
    states.append({k: v + 0.5 for k, v in states[0].items()})
    for s in states:
        xor.commit(s)
        quant.commit(s)
    assert _chunks(root, LARGE)
    got = xor.checkout("main")
    for k, v in states[-1].items():
        assert torch.equal(got[k], v)
    q = quant.checkout("main")["emb"]
    assert np.abs((q - states[-1]["emb"]).numpy()).max() < 0.05
    xor.close()
    quant.close()


def _truncate_under_the_reader(root: str, size: int, to: int) -> None:
    """In a child: read a chunk, truncate its file, then use the bytes read (a mapping would
    ``SIGBUS`` here)."""
    storage = LocalStorage(root)
    data = os.urandom(size)
    storage.put_chunk("data/c/0", data)
    got = storage.read_chunk("data/c/0")
    os.truncate(storage.path("data/c/0"), to)
    assert bytes(got) == data
    os.truncate(storage.path("data/c/0"), to)  # truncated before the read: a short chunk
    assert bytes(storage.read_chunk("data/c/0")) == data[:to]


@pytest.mark.parametrize("to", [0, "half"])
def test_chunk_truncated_while_read_never_kills_the_reader(tmp_path, to):
    size = 3 << 20
    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=_truncate_under_the_reader,
                    args=(str(tmp_path / "s"), size, size // 2 if to == "half" else 0))
    p.start()
    p.join(60)
    assert p.exitcode == 0, f"the reader ended with {p.exitcode} (negative: killed by a signal)"


# -- raw chunks read straight into their destination (issue 26 item 10, the rest) -------------
RAW = EncodingOptions(compression="none", chunk_bytes=4096, pack_below=0)
ODD = 1009  # rows: a prime, so the last chunk is zarr's padded edge chunk


def _bits(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """A tensor of ``dtype`` holding random bits (random 0/1 for bool)."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    width = dtype.itemsize
    raw = torch.randint(0, 256, (*shape, width) if shape else (width,), dtype=torch.uint8,
                        generator=g)
    return raw.view(dtype).reshape(shape)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def test_raw_chunks_are_read_into_place_not_through_a_bytes_object(tmp_path):
    """A local store's raw chunks go from the file into the output's memory (``read_chunk_into``):
    ``read_chunk``, which makes a bytes object of each, is never asked for them."""
    store = ckptstore.open(str(tmp_path / "s"), options=RAW)
    state = {"emb": _bits(torch.float32, (ODD, 16), 1), "half": _bits(torch.bfloat16, (ODD,), 2)}
    store.commit(state)
    asked: list[str] = []
    whole = store.storage.read_chunk
    store.storage.read_chunk = lambda key: asked.append(key) or whole(key)
    got = store.checkout("main")
    into = {k: torch.zeros_like(v) for k, v in state.items()}
    store.checkout("main", into=into)
    assert all(_same_bits(got[k], v) and _same_bits(into[k], v) for k, v in state.items())
    assert asked == []
    store.close()


@pytest.mark.parametrize("dtype", [getattr(torch, name) for name in sorted(STORAGE)
                                   if isinstance(getattr(torch, name, None), torch.dtype)],
                         ids=str)
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_every_dtype_round_trips_through_reads_into_place(tmp_path, dtype):
    store = ckptstore.open(str(tmp_path / "s"), options=RAW)
    state = {"rows": _bits(dtype, (ODD, 3), 3), "flat": _bits(dtype, (ODD,), 4),
             "scalar": _bits(dtype, (), 5), "wide": _bits(dtype, (2, 700), 6)}
    store.commit(state)
    got = store.checkout("main")
    into = {k: torch.zeros_like(v) for k, v in state.items()}
    store.checkout("main", into=into)
    for k, v in state.items():
        assert _same_bits(got[k], v), k
        assert _same_bits(into[k], v), k
    store.close()


def _raw_array(storage, shape: tuple[int, ...], chunks: tuple[int, ...]) -> np.ndarray:
    """A float64 array written raw under ``a`` with the given chunk grid; the array."""
    a = np.random.default_rng(7).standard_normal(shape)
    with ThreadPoolExecutor(2) as pool:
        for f in write_array(storage, "a", a, ChunkGrid(shape, chunks), RawLossless(), None,
                             pool.submit):
            f.result()
    return a


def _region(storage, a: np.ndarray, chunks: tuple[int, ...], offsets: list[int],
            lengths: list[int]) -> np.ndarray:
    """``start_read_region`` of a block straight into a new array."""
    into = np.full(lengths, np.nan)

    def put(row: int, part: np.ndarray) -> None:
        into[row: row + part.shape[0]] = part

    with ThreadPoolExecutor(2) as pool:
        for f in start_read_region(storage, "a", ChunkGrid(a.shape, chunks), a.dtype,
                                   RawLossless(), pool, offsets, lengths, put, into=into):
            f.result()
    return into


def _rows(storage, a: np.ndarray, chunks: tuple[int, ...], rows: tuple[int, int] | None):
    with ThreadPoolExecutor(2) as pool:
        return read_array(storage, "a", ChunkGrid(a.shape, chunks), a.dtype, RawLossless(),
                          pool, rows)


BLOCKS = [((0, 0), (103, 5)), ((13, 0), (41, 5)), ((95, 0), (8, 5)), ((7, 2), (60, 2)),
          ((99, 4), (1, 1))]


@pytest.mark.parametrize("url", ["local", "memory"])
def test_chunk_misaligned_rows_and_blocks_read_into_place(tmp_path, url):
    """Rows and blocks that start and end inside chunks (and in zarr's padded edge chunk), on a
    local disk (read into place) and in memory (read, then copied)."""
    storage = open_storage(str(tmp_path / "s") if url == "local" else f"memory://{tmp_path}")
    chunks = (10, 5)
    a = _raw_array(storage, (103, 5), chunks)
    for rows in (None, (0, 103), (3, 17), (20, 30), (95, 103), (102, 103), (0, 1)):
        want = a if rows is None else a[rows[0]:rows[1]]
        np.testing.assert_array_equal(_rows(storage, a, chunks, rows), want)
    for offsets, lengths in BLOCKS:
        want = a[offsets[0]:offsets[0] + lengths[0], offsets[1]:offsets[1] + lengths[1]]
        np.testing.assert_array_equal(_region(storage, a, chunks, list(offsets), list(lengths)),
                                      want)
    one = np.random.default_rng(2).standard_normal(())  # a 0-d array: one chunk of one item
    with ThreadPoolExecutor(1) as pool:
        for f in write_array(storage, "z", one, ChunkGrid((), ()), RawLossless(), None,
                             pool.submit):
            f.result()
        assert read_array(storage, "z", ChunkGrid((), ()), one.dtype, RawLossless(),
                          pool) == one


DAMAGE = ["flip-first", "flip-middle", "flip-last-body", "flip-crc", "truncate-1", "truncate-3",
          "truncate-0", "longer"]


def _damage(path: str, how: str) -> None:
    size = os.path.getsize(path)
    if how.startswith("flip"):
        at = {"flip-first": 0, "flip-middle": size // 2, "flip-last-body": size - 5,
              "flip-crc": size - 2}[how]
        with open(path, "r+b") as f:
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0x20]))
    elif how == "longer":
        with open(path, "ab") as f:
            f.write(b"\0")
    else:
        os.truncate(path, {"truncate-1": size - 1, "truncate-3": 3, "truncate-0": 0}[how])


@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_raw_chunks_fail_through_reads_into_place(tmp_path, how):
    """A corrupt, truncated or longer raw chunk is a ``CorruptedChunkError`` naming it, whichever
    part of it the read wanted (the whole chunk, rows at its start, in its middle, at its end),
    and the other chunks still read."""
    storage = LocalStorage(tmp_path / "s")
    chunks = (10, 5)
    a = _raw_array(storage, (103, 5), chunks)
    _damage(storage.path("a/c/1/0"), how)  # rows 10-20
    for rows in (None, (10, 20), (10, 12), (14, 16), (18, 20), (5, 25)):
        with pytest.raises(CorruptedChunkError, match="a/c/1/0"):
            _rows(storage, a, chunks, rows)
    for offsets, lengths in ([0, 0], [103, 5]), ([12, 0], [3, 5]), ([15, 1], [10, 3]):
        with pytest.raises(CorruptedChunkError, match="a/c/1/0"):
            _region(storage, a, chunks, offsets, lengths)
    np.testing.assert_array_equal(_rows(storage, a, chunks, (20, 103)), a[20:])
