"""Hostile stores: manifests with valid checksums that lie. A reader bounds what they make it
allocate or walk by what the store holds (ckptstore.limits), refuses names that are not one
safe path component, and verify compares the zarr metadata plain zarr reads with the manifest.
Each test checks the error type, that nothing huge was walked, and that the store is unchanged."""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
import torch

import ckptstore
from ckptstore.errors import AllocationError, CorruptedChunkError, InvalidRefName, \
    ManifestError, UnsupportedLeafError
from ckptstore.format.layout import ZARR_JSON, array_dir, check_ref_name, data_dir, manifest_key
from ckptstore.chunkcodec import RawLossless
from ckptstore.limits import READ_LIMITS
from ckptstore.history.manifest import Manifest, encode_manifest
from ckptstore.dcp.shards import LocalTensor, commit_shards
from ckptstore.storage import Storage

Raw = dict[str, Any]


def _contents(storage: Storage) -> dict[str, bytes]:
    return {k: storage.read(k) for k in storage.walk_sizes("")}


def _entry(raw: Raw, path: str) -> Raw:
    return next(e for e in raw["tensors"] if e["path"] == path)


def _rewrite(storage: Storage, commit: str, change: Callable[[Raw], None], validate: bool = True
             ) -> None:
    """Store a changed manifest of ``commit`` with a valid checksum: through the model and
    ``encode_manifest`` where it still validates, else framed by hand (names the model refuses)."""
    key = manifest_key(commit)
    data = storage.read(key)
    raw = msgpack.unpackb(data[37:], strict_map_key=False)
    change(raw)
    if validate:
        storage.put(key, encode_manifest(Manifest.model_validate(raw)))
    else:
        payload = msgpack.packb(raw, use_bin_type=True)
        storage.put(key, data[:5] + hashlib.sha256(payload).digest() + payload)


@pytest.fixture
def hostile(open_backend_store):
    """``(open, commit id)``: a store holding ``w`` (300,000 floats, 1 chunk of 8 MiB at most),
    ``m`` (1000 x 300) and a packed ``b``; ``open()`` opens it again (no cached manifests)."""
    store = open_backend_store()
    info = store.commit({"w": torch.randn(300_000), "m": torch.randn(1000, 300),
                         "b": torch.ones(4)}, message="ok")
    return open_backend_store, info.id


def _both_refuse(open_: Callable[[], ckptstore.Store], commit: str, text: str) -> None:
    """checkout raises ManifestError, verify reports the same without walking the grid."""
    store = open_()
    with pytest.raises(ManifestError, match=re.escape(text)):
        store.checkout(commit)
    report = store.verify(commit)
    assert not report.ok and any(text in p for p in report.problems), report.problems
    assert report.chunks_checked <= 5 and len(report.problems) <= 3  # nothing was walked


@pytest.mark.parametrize("chunks", [None, [1]], ids=["stored-chunk-size", "one-row-chunks"])
def test_a_huge_shape_is_refused_before_allocating_or_walking(hostile, chunks):
    open_, commit = hostile
    storage = open_().storage

    def huge(raw: Raw) -> None:
        w = _entry(raw, "w")
        w["shape"] = [10**10]  # 37 GiB of float32 whose chunks the store does not hold
        w["chunks"] = chunks or w["chunks"]

    _rewrite(storage, commit, huge)
    before = _contents(storage)
    text = "declares 33334 chunks but the store holds 1" if chunks is None else \
        f"beyond what a reader accepts ({READ_LIMITS.max_chunks} chunks"
    _both_refuse(open_, commit, text)
    assert _contents(storage) == before


def test_a_few_chunks_beyond_the_store_are_named_as_missing(hostile):
    """A grid a few chunks larger than stored is damage: each missing chunk is named, and
    checkout fails before allocating the array."""
    open_, commit = hostile
    storage = open_().storage

    def grow(raw: Raw) -> None:
        w = _entry(raw, "w")
        w["shape"] = [3 * w["chunks"][0]]

    _rewrite(storage, commit, grow)
    before = _contents(storage)
    store = open_()
    w = array_dir(commit, "w")
    with pytest.raises(CorruptedChunkError, match="is missing") as err:
        store.checkout(commit)
    assert err.value.path == f"{w}/c/1"
    problems = store.verify(commit).problems
    assert [p for p in problems if "missing" in p] == [f"{w}/c/1: missing", f"{w}/c/2: missing"]
    assert any(p.startswith(f"{w}/{ZARR_JSON}: does not match the manifest (shape")
               for p in problems)
    assert _contents(storage) == before


def test_one_huge_chunk_is_refused(hostile):
    open_, commit = hostile
    storage = open_().storage

    def one_chunk(raw: Raw) -> None:
        _entry(raw, "w").update(shape=[10**10], chunks=[10**10])  # 1 chunk "stored", 40 GB

    _rewrite(storage, commit, one_chunk)
    before = _contents(storage)
    _both_refuse(open_, commit, "chunks of 40000000000 bytes")
    assert _contents(storage) == before


def test_a_huge_packed_array_is_refused(hostile):
    open_, commit = hostile
    storage = open_().storage
    _rewrite(storage, commit, lambda raw: raw["packed"].update(nbytes=10**12))
    before = _contents(storage)
    _both_refuse(open_, commit, "declares")
    assert _contents(storage) == before


def test_other_dimensions_are_a_clear_error(tmp_path):
    """One more or one fewer dimension than stored: chunk keys meet folders or files."""
    root = tmp_path / "s"
    store = ckptstore.open(root)
    commit = store.commit({"w": torch.randn(30000), "m": torch.randn(1000, 30)}).id

    def reshape(raw: Raw) -> None:
        _entry(raw, "m").update(shape=[30000], chunks=[30000])      # c/0 is a folder
        _entry(raw, "w").update(shape=[30000, 1], chunks=[30000, 1])  # c/0 is a file

    _rewrite(store.storage, commit, reshape)
    before = _contents(store.storage)
    reopened = ckptstore.open(root, create=False)
    with pytest.raises(CorruptedChunkError, match="manifest's dimensions disagree"):
        reopened.checkout(commit)
    problems = reopened.verify(commit).problems
    for name in ("m", "w"):
        assert any(p.startswith(f"{array_dir(commit, name)}/{ZARR_JSON}: does not match")
                   and "shape" in p for p in problems), problems
        assert any(p.startswith(f"{array_dir(commit, name)}/c/0") and "not a chunk" in p
                   for p in problems), problems
    assert _contents(store.storage) == before


@pytest.mark.parametrize("name", ["a\\b", "..\\..\\evil", "a\0b", "C:evil", "a\nb", "..", "a/b",
                                  "__x", "é"])
@pytest.mark.parametrize("where", ["tensor", "packed"])
def test_array_names_that_are_not_one_safe_path_component(hostile, name, where):
    open_, commit = hostile
    storage = open_().storage

    def rename(raw: Raw) -> None:
        if where == "tensor":
            _entry(raw, "w")["array"] = name
        else:
            raw["packed"]["array"] = name

    _rewrite(storage, commit, rename, validate=False)
    before = _contents(storage)
    store = open_()
    with pytest.raises(ManifestError, match="bad (packed )?array name"):
        store.checkout(commit)
    report = store.verify(commit)
    assert len(report.problems) == 1 and "bad" in report.problems[0]
    assert _contents(storage) == before


def test_array_keys_refuse_unsafe_names():
    good = "0123456789abcdef0123456789abcdef"
    assert array_dir(good, "r0.model.emb~3.xvalues") == f"data/{good}/r0.model.emb~3.xvalues"
    for commit, name in [(good, "a\\b"), (good, "x\0"), (good, ".."), (good + "\n", "w"),
                         ("../" + good[3:], "w")]:
        with pytest.raises(ManifestError, match="not a name ckptstore writes"):
            array_dir(commit, name)


def test_ref_names_are_matched_whole(tmp_path):
    store = ckptstore.open(tmp_path / "s")
    commit = store.commit({"w": torch.ones(3)}).id
    for name in ("main\n", "x\0", "a\\b"):
        with pytest.raises(InvalidRefName):
            check_ref_name(name)
        with pytest.raises(InvalidRefName):
            store.branch(name, commit)
    assert sorted(p.name for p in (tmp_path / "s" / "refs" / "heads").iterdir()) == ["main"]


def test_a_ref_file_of_other_unicode_digits_is_not_a_move(tmp_path):
    """int() reads full-width digits; a ref file so named is not one of the branch's moves."""
    store = ckptstore.open(tmp_path / "s")
    commit = store.commit({"w": torch.ones(3)}).id
    store.storage.put("refs/heads/main/" + "\uff10" * 11 + "\uff11", (commit + "\n").encode())
    reopened = ckptstore.open(tmp_path / "s", create=False)
    assert reopened.repo.refs.tip("main") == (0, commit)
    assert torch.equal(reopened.checkout("main")["w"], torch.ones(3))


def _edit_json(storage: Storage, key: str, change: Callable[[dict], None]) -> None:
    doc = json.loads(storage.read(key))
    change(doc)
    storage.put(key, json.dumps(doc).encode())


@pytest.mark.parametrize("field,value", [
    ("shape", [300001]),
    ("data_type", "float64"),
    ("chunk_grid", {"name": "regular", "configuration": {"chunk_shape": [1000]}}),
    ("codecs", [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]),
    ("node_type", "group"),
])
def test_verify_compares_array_metadata_with_the_manifest(hostile, field, value):
    """What plain zarr reads must be what the manifest says: a flipped digit is a problem."""
    open_, commit = hostile
    storage = open_().storage
    where = f"{array_dir(commit, 'w')}/{ZARR_JSON}"
    _edit_json(storage, where, lambda doc: doc.update({field: value}))
    report = open_().verify(commit)
    assert len(report.problems) == 1, report.problems
    assert report.problems[0].startswith(f"{where}: does not match the manifest ({field} ")


@pytest.mark.parametrize("damage", ["node_type", "missing", "garbage"])
def test_verify_checks_the_group_metadata(hostile, damage):
    open_, commit = hostile
    storage = open_().storage
    where = f"{data_dir(commit)}/{ZARR_JSON}"
    if damage == "node_type":
        _edit_json(storage, where, lambda doc: doc.update(node_type="array"))
    elif damage == "missing":
        storage.delete(where)
    else:
        storage.put(where, b"\xff[")
    report = open_().verify(commit)
    assert report.problems == [p for p in report.problems if p.startswith(f"{where}: ")]
    assert len(report.problems) == 1


def test_an_honest_store_passes_every_check(hostile):
    open_, commit = hostile
    report = open_().verify(commit)
    assert report.ok and report.chunks_checked >= 3, report.problems


def _history(tmp_path, n: int = 3) -> tuple[ckptstore.Store, list[str]]:
    store = ckptstore.open(tmp_path / "s")
    return store, [store.commit({"w": torch.ones(3) * i}).id for i in range(n)]


@pytest.mark.parametrize("loop", ["self", "three"])
def test_a_history_that_loops_is_refused_not_walked_forever(tmp_path, loop):
    """A parent that is the commit itself, or a newer one: log, ~N and gc end with a
    ManifestError or their answer (issue 26 item 7: log never returned)."""
    store, ids = _history(tmp_path)
    first = ids[2] if loop == "self" else ids[0]
    _rewrite(store.storage, first, lambda raw: raw.update(parent=ids[2]), validate=False)
    before = _contents(store.storage)
    store = ckptstore.open(tmp_path / "s", create=False)
    with pytest.raises(ManifestError, match="loops back"):
        list(itertools.islice(store.iter_log("main"), 50))  # before the fix: 50 entries
    with pytest.raises(ManifestError, match="loops back"):
        store.log("main")
    with pytest.raises(ManifestError, match="loops back"):
        store.resolve("main~100000")
    if loop == "three":
        assert store.resolve("main~2") == ids[0]
    assert sorted(store.reachable()) == sorted(ids[2:] if loop == "self" else ids)
    assert store.gc(keep_last=1, dry_run=True, grace_period=0).kept
    assert _contents(store.storage) == before


def test_a_chain_that_loops_through_two_commits_is_named(tmp_path):
    store = ckptstore.open(tmp_path / "s", options=ckptstore.EncodingOptions(chunk_bytes=4096))
    policy = ckptstore.Policy(delta=True, min_quant_bytes=1024)
    ids = [store.commit({"w": torch.randn(3000)}, policy=policy).id for _ in range(3)]
    _rewrite(store.storage, ids[1], lambda raw: _entry(raw, "w").update(base_commit=ids[2]))
    store = ckptstore.open(tmp_path / "s", create=False)
    with pytest.raises(ManifestError, match="loops back to commit"):
        store.checkout(ids[2])
    assert any("loops back to commit" in p for p in store.verify(ids[2]).problems)


@pytest.mark.parametrize("time", [float("nan"), float("inf"), 1e300, -1e300, -1.0])
def test_a_commit_time_no_clock_gives_is_refused(tmp_path, time):
    """NaN or 1e300 made log raise ValueError / OverflowError; now a ManifestError names it."""
    store, ids = _history(tmp_path, 2)
    _rewrite(store.storage, ids[1], lambda raw: raw.update(time=time), validate=False)
    store = ckptstore.open(tmp_path / "s", create=False)
    with pytest.raises(ManifestError, match="time"):
        store.log("main")
    assert not store.verify().ok


_ALLOCATE = """
import resource, sys
import ckptstore
store = ckptstore.open(sys.argv[1], create=False)
vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + 3 * 2**30, resource.RLIM_INFINITY))
for call in (lambda: store.checkout(sys.argv[2]), lambda: print(store.verify(sys.argv[2]).ok)):
    try:
        call()
    except ckptstore.CkptStoreError as e:
        print(type(e).__name__, isinstance(e, MemoryError), e)
"""


def _huge(raw: Raw) -> None:
    for e in [_entry(raw, "m"), *(_entry(raw, "m")["parts"] or {}).values()]:
        e.update(shape=[2**30, 4], chunks=[2**28, 4])


def _huge_shards(raw: Raw) -> None:
    """Two pieces of [2**28, 4] (one 4 GiB chunk each): an 8 GiB sharded tensor."""
    raw["tensors"][0]["shape"] = [2**29, 4]
    raw["tensors"][0]["pieces"][1]["offsets"] = [2**28, 0]
    for shard in raw["shards"]:
        shard.update(shape=[2**28, 4], chunks=[2**28, 4])


@pytest.mark.parametrize("kind", ["array", "code-deltas", "sharded"])
def test_an_array_no_process_can_allocate_is_a_clear_error(tmp_path, kind):
    """[2**30, 4] float32 in 4 stored chunks of 2**28 rows passes the read limits (4 GiB chunks)
    and asks for 16 GiB: in a process that cannot have them, a ckptstore error (a
    MemoryError) says so, and verify reports it (issue 26 item 7: a raw MemoryError). The same
    for code deltas, and for a sharded tensor of two such pieces."""
    root = tmp_path / "s"
    store = ckptstore.open(root, options=ckptstore.EncodingOptions(chunk_bytes=16 * 1024))
    if kind == "sharded":
        m = torch.randn(16384, 4)  # pieces of 128 KiB: arrays of their own
        commits = [commit_shards(store, [[LocalTensor("m", (8192 * r, 0), (16384, 4),
                                                      m[8192 * r:][:8192])] for r in range(2)]).id]
        _rewrite(store.storage, commits[0], _huge_shards)
    else:
        chain = kind == "code-deltas"
        policy = ckptstore.Policy(delta=True, quantize=ckptstore.QuantSpec(bits=8),
                                  min_quant_bytes=1024) if chain else None
        commits = [store.commit({"m": torch.randn(4096, 4)}, policy=policy).id
                   for _ in range(1 + chain)]
        for c in commits:
            _rewrite(store.storage, c, _huge)
    commit = commits[-1]
    out = subprocess.run([sys.executable, "-c", _ALLOCATE, str(root), commit],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("AllocationError True"), out.stdout
    assert lines[1] == "False", out.stdout


class _UnreadChunk:
    """A chunk source the codec must not read (the test checks what it allocates first)."""

    where = "m/c/0/0"

    def read(self) -> bytes:
        raise AssertionError("read before its scratch was allocated")

    read_into = read


def test_a_region_read_of_a_chunk_no_process_can_hold_is_a_clear_error():
    """Reading the last row of a raw chunk scatters the rows before it into scratch memory;
    a chunk claiming 2**40 rows (16 TiB) is an AllocationError naming it, not a raw
    MemoryError (issue 26 item 7, the last ``np.empty`` a manifest could size)."""
    out = np.empty((1, 4), np.float32)
    with pytest.raises(AllocationError, match="chunk m/c/0/0") as e:
        RawLossless().read_rows(_UnreadChunk(), (2**40, 4), np.dtype(np.float32),
                                (2**40 - 1, 2**40), out)
    assert isinstance(e.value, MemoryError)


@pytest.mark.parametrize("shape", [(0, 2**62), (2**61, 0, 8)])
def test_a_tensor_no_array_can_hold_is_refused_at_commit(tmp_path, shape):
    """``torch.empty(0, 2**62)`` exists; its numpy array does not ("array is too big"), so such
    a commit could never be read back (issue 26 item 9): refused before anything is written.
    A manifest that declares one anyway is refused by checkout and reported by verify
    (``test_verify_is_checkout``: the ``*-overflow`` cases)."""
    store = ckptstore.open(tmp_path / "s")
    before = _contents(store.storage)
    with pytest.raises(UnsupportedLeafError, match="could never"):
        store.commit({"ok": torch.ones(3), "a": torch.empty(*shape)})
    assert store.branches() == {} and _contents(store.storage) == before


def _deep(level: bytes, depth: int, leaf: object) -> bytes:
    """msgpack bytes of ``depth`` nested one-key maps or one-item lists (a hostile writer is
    not held to msgpack's packing recursion limit)."""
    return level * depth + msgpack.packb(leaf)


@pytest.mark.parametrize("where,depth", [("tree", 500), ("metadata", 500)])
def test_a_manifest_nested_beyond_any_writer_is_refused(tmp_path, where, depth):
    """A state tree nested deeper than flatten writes (200 levels) made checkout and verify
    raise a raw RecursionError; deep metadata broke log --json. Both are a ManifestError now."""
    store, ids = _history(tmp_path, 2)
    key = manifest_key(ids[1])
    data = store.storage.read(key)
    raw = msgpack.unpackb(data[37:], strict_map_key=False)
    raw[where] = "HOLE"
    level = b"\x81\xa4list\x91" if where == "tree" else b"\x81\xa1k"
    payload = msgpack.packb(raw, use_bin_type=True).replace(
        msgpack.packb("HOLE"), _deep(level, depth, {"tensor": 0} if where == "tree" else 1))
    store.storage.put(key, data[:5] + hashlib.sha256(payload).digest() + payload)
    store = ckptstore.open(tmp_path / "s", create=False)
    with pytest.raises(ManifestError, match="nested"):
        store.checkout(ids[1])
    with pytest.raises(ManifestError, match="nested"):
        store.log()
    report = store.verify()
    assert any("nested" in p for p in report.problems), report.problems
    assert torch.equal(store.checkout(ids[0])["w"], torch.zeros(3))


def test_the_deepest_state_a_commit_takes_still_checks_out(tmp_path):
    """200 levels of dicts and OrderedDicts (what flatten accepts) stay within the nesting a
    manifest may have."""
    node: Any = torch.ones(2)
    for i in range(199):
        node = {"k": node} if i % 2 else collections.OrderedDict(k=node)
    node._metadata = {"": {"version": 1}}  # what a module's state_dict carries
    store = ckptstore.open(tmp_path / "s")
    commit = store.commit({"x": node}).id
    store = ckptstore.open(tmp_path / "s", create=False)
    out = store.checkout(commit)["x"]
    for _ in range(199):
        out = out["k"]
    assert torch.equal(out, torch.ones(2)) and store.verify().ok
