"""Hypothesis fuzzing of what a store reads back: manifests, ref files and chunk payloads.

Whatever bytes an object holds, reading it either gives the committed data or raises a
ckptstore error; never another exception, never other data. Manifests are fuzzed twice: as raw
bytes (flips, truncations, garbage: the checksum must catch them) and as re-framed payloads with
a valid checksum whose fields hypothesis replaces (the schema validation must catch those). The
default run tries a few dozen examples per target; ``-m slow`` a few thousand.
"""

from __future__ import annotations

import hashlib
import uuid

import msgpack
import pytest
import torch
from helpers import assert_bit_exact
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ckptstore
from ckptstore.format.layout import manifest_key
from ckptstore.history.manifest import FORMAT_VERSION, MAGIC, decode_manifest

FAST = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=list(HealthCheck))
LONG = settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 128, generator=g), "b": torch.randn(8, generator=g),
            "step": seed, "name": f"run-{seed}"}


@pytest.fixture(scope="module")
def made():
    """A memory store with two commits: (store, {commit id: state}, chunk keys)."""
    store = ckptstore.open(f"memory://fuzz-{uuid.uuid4().hex}",
                           options=ckptstore.EncodingOptions(chunk_bytes=8192))
    states = {store.commit(_state(s)).id: _state(s) for s in (1, 2)}
    keys = sorted(k for k in store.storage.walk_sizes("data") if "/c/" in k)
    yield store, states, keys
    store.close()


def _read_all(store: ckptstore.Store, states: dict) -> None:
    """Check out every commit: exact, or a ckptstore error (anything else propagates)."""
    for c, state in states.items():
        store.repo.forget(c)
        try:
            got = store.checkout(c)
        except ckptstore.CkptStoreError:
            continue
        assert_bit_exact(state, got)


_flips = st.lists(st.tuples(st.integers(0, 10**9), st.integers(1, 255)), min_size=1,
                  max_size=4)


def _mutate(data: bytes, flips: list[tuple[int, int]], cut: int | None) -> bytes:
    out = bytearray(data)
    for pos, x in flips:
        out[pos % len(out)] ^= x
    return bytes(out[:cut] if cut is not None else out)


def _framed(payload: bytes) -> bytes:
    return MAGIC + bytes([FORMAT_VERSION]) + hashlib.sha256(payload).digest() + payload


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(
        max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)


def _manifest_targets(made) -> tuple[ckptstore.Store, dict, str, bytes]:
    store, states, _ = made
    c = next(iter(states))
    key = manifest_key(c)
    return store, states, key, store.storage.read(key)


def _fuzz_manifest_bytes(made, flips, cut, garbage):
    store, states, key, original = _manifest_targets(made)
    data = garbage if garbage is not None else _mutate(original, flips, cut)
    try:
        with pytest.raises(ckptstore.CkptStoreError):
            if data != original:
                decode_manifest(data, key)
            else:
                raise ckptstore.ManifestError("unchanged")
        store.storage.put(key, data)
        _read_all(store, states)
    finally:
        store.storage.put(key, original)


def _fuzz_manifest_fields(made, path, value):
    """Replace one field (``path`` into the payload) with ``value``, re-frame, read."""
    store, states, key, original = _manifest_targets(made)
    raw = msgpack.unpackb(original[37:], raw=False, strict_map_key=False)
    node = raw
    for step in path[:-1]:
        if isinstance(node, dict) and node:
            node = node[sorted(node, key=str)[step % len(node)]]
        elif isinstance(node, list) and node:
            node = node[step % len(node)]
    if isinstance(node, dict) and node:
        node[sorted(node, key=str)[path[-1] % len(node)]] = value
    elif isinstance(node, list) and node:
        node[path[-1] % len(node)] = value
    data = _framed(msgpack.packb(raw, use_bin_type=True))
    try:
        try:
            decode_manifest(data, key)
        except ckptstore.CkptStoreError:
            pass
        store.storage.put(key, data)
        for c in states:  # a field changed on purpose: reading must end cleanly, either way
            store.repo.forget(c)
            try:
                store.checkout(c)
            except ckptstore.CkptStoreError:
                pass
    finally:
        store.storage.put(key, original)


def _fuzz_ref(made, data):
    store, states, _ = made
    key = "refs/heads/fuzz/000000000000"
    store.storage.put(key, data)
    try:
        try:
            tip = store.resolve("fuzz")
        except ckptstore.CkptStoreError:
            return
        assert data.strip() == tip.encode() and tip in states  # only a valid id resolves
    finally:
        store.storage.delete(key)


def _fuzz_chunk(made, which, flips, cut):
    store, states, keys = made
    key = keys[which % len(keys)]
    original = store.storage.read(key)
    store.storage.put(key, _mutate(original, flips, cut))
    try:
        _read_all(store, states)
    finally:
        store.storage.put(key, original)


_manifest_bytes = dict(flips=_flips, cut=st.none() | st.integers(0, 4000),
                       garbage=st.none() | st.binary(max_size=200))
_fields = dict(path=st.lists(st.integers(0, 1000), min_size=1, max_size=6), value=_values)
_refs = dict(data=st.binary(max_size=60) | st.text(alphabet="0123456789abcdefABCDEF\n ",
                                                       min_size=30, max_size=36).map(str.encode))
_chunks = dict(which=st.integers(0, 1000), flips=_flips, cut=st.none() | st.integers(0, 9000))


@FAST
@given(**_manifest_bytes)
def test_fuzz_manifest_bytes(made, flips, cut, garbage):
    _fuzz_manifest_bytes(made, flips, cut, garbage)


@FAST
@given(**_fields)
def test_fuzz_manifest_fields(made, path, value):
    _fuzz_manifest_fields(made, path, value)


@FAST
@given(**_refs)
def test_fuzz_ref_files(made, data):
    _fuzz_ref(made, data)


@FAST
@given(**_chunks)
def test_fuzz_chunk_payloads(made, which, flips, cut):
    _fuzz_chunk(made, which, flips, cut)


@pytest.mark.slow
@LONG
@given(**_manifest_bytes)
def test_fuzz_manifest_bytes_long(made, flips, cut, garbage):
    _fuzz_manifest_bytes(made, flips, cut, garbage)


@pytest.mark.slow
@LONG
@given(**_fields)
def test_fuzz_manifest_fields_long(made, path, value):
    _fuzz_manifest_fields(made, path, value)


@pytest.mark.slow
@LONG
@given(**_refs)
def test_fuzz_ref_files_long(made, data):
    _fuzz_ref(made, data)


@pytest.mark.slow
@LONG
@given(**_chunks)
def test_fuzz_chunk_payloads_long(made, which, flips, cut):
    _fuzz_chunk(made, which, flips, cut)
