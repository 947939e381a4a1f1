"""Chunks of a local store are read, never mapped (``LocalStorage.read_chunk``, issue 26 item
10; they were mapped from 1 MiB before): what a checkout hands back is never the store's pages
(it is writable and stays valid after gc), and a chunk file damaged or truncated while it is
read is a clear error, never a ``SIGBUS`` that ends the process."""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
import pytest
import torch

import ckptstore
from ckptstore.errors import CorruptedChunkError
from ckptstore.plan import EncodingOptions
from ckptstore.policy import Policy, QuantSpec
from ckptstore.storage import LocalStorage

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
