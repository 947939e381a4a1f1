"""verify compares every ``zarr.json`` with what the writer makes of the manifest, byte for byte:
stores of every encoding verify clean, and any change to a group's or an array's metadata -- a
field, an attribute, an extra key, a change JSON parsing tolerates -- is reported by file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import ckptstore
from ckptstore import EncodingOptions, Policy, QuantSpec
from ckptstore.format.layout import ZARR_JSON, array_dir, data_dir
from ckptstore.policy import Shrink

DATA = Path(__file__).parents[1] / "data"
OPTIONS = EncodingOptions(chunk_bytes=16 * 1024, pack_below=1024)  # most tensors: own arrays


def _state(seed: int) -> dict:
    """Tensors of every layout and several dtypes; ``emb`` changes 8 rows per seed."""
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(1024, 16, generator=torch.Generator().manual_seed(0))
    emb[torch.randperm(1024, generator=g)[:8]] = torch.randn(8, 16, generator=g)
    base = torch.randn(64, 32, generator=g)
    tied = torch.randn(16, generator=g)
    return {"emb": emb, "w": torch.randn(128, 160, generator=g),  # 80 KiB: quantized
            "bf": torch.randn(64, 64, generator=g).to(torch.bfloat16),
            "cplx": torch.randn(40, 8, generator=g, dtype=torch.complex64),
            "mask": torch.rand(300, generator=g) > 0.5, "zero_d": torch.tensor(seed * 1.5),
            "img": torch.randn(2, 8, 6, 6, generator=g).to(memory_format=torch.channels_last),
            "tied": {"a": tied, "b": tied}, "views": {"base": base, "half": base[::2, 1:]},
            "small": torch.ones(3) * seed, "step": seed}


POLICIES = {
    "full": Policy(),
    "quantized": Policy(quantize=QuantSpec(bits=8), min_quant_bytes=16 * 1024),
    "quantized4": Policy(quantize=QuantSpec(bits=4), min_quant_bytes=16 * 1024),
    "one-shot": Policy(incremental="one-shot", min_rows=512),
    "consecutive": Policy(incremental="consecutive", min_rows=512),
    "xor-delta": Policy(delta=True),
    "code-delta": Policy(delta=True, quantize=QuantSpec(bits=8), min_quant_bytes=16 * 1024),
}


def _zarr_jsons(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(ZARR_JSON))


@pytest.fixture(scope="module")
def every_encoding(tmp_path_factory) -> Path:
    """A local store with two commits of each policy (chains of each kind), then the same with
    entropy coding and dedup."""
    root = tmp_path_factory.mktemp("verify") / "store"
    seed = 0
    with ckptstore.open(root, options=OPTIONS) as store:
        for policy in POLICIES.values():
            for _ in range(2):
                seed += 1
                store.commit(_state(seed), policy=policy)
        torch.manual_seed(0)  # ExCP's shrinking: weights as quantized residuals (a chain)
        model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 10))
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(64, 32)).square().mean().backward()
            opt.step()
            store.commit({"model": model, "optim": opt},
                         policy=Policy(shrink=Shrink.of(model, opt)))
    options = EncodingOptions(chunk_bytes=16 * 1024, pack_below=1024, compression="entropy",
                              dedup=True)
    with ckptstore.open(root, options=options) as store:
        for policy in (Policy(), Policy(), Policy(delta=True)):
            store.commit(_state(seed), policy=policy)  # the same state: dedup reuses arrays
    return root


def test_stores_of_every_encoding_verify_clean(every_encoding):
    with ckptstore.open(every_encoding, create=False) as store:
        report = store.verify()
    assert report.ok, report.problems
    assert report.commits_checked == 2 * len(POLICIES) + 2 + 3


@pytest.mark.parametrize("golden", ["golden_v1", "golden_v1_chains"])
def test_golden_stores_verify_clean(golden):
    with ckptstore.open(DATA / golden, create=False) as store:
        report = store.verify()
    assert report.ok, report.problems


def test_every_zarr_json_is_checked(every_encoding, tmp_path):
    """Each metadata file the writer made is one verify reads: removing it is reported."""
    import shutil

    root = tmp_path / "store"
    shutil.copytree(every_encoding, root)
    files = _zarr_jsons(root)
    assert any(f.endswith(f"w.xor/{ZARR_JSON}") for f in files)
    assert any(f.endswith(f"emb.rows/{ZARR_JSON}") for f in files)
    assert any(f.endswith(f".residual/{ZARR_JSON}") for f in files)
    with ckptstore.open(root, create=False) as store:
        for rel in files:
            data = (root / rel).read_bytes()
            (root / rel).unlink()
            try:
                problems = store.verify(rel.split("/")[1]).problems  # its commit
            finally:
                (root / rel).write_bytes(data)
            if rel.endswith(f".codes/{ZARR_JSON}"):  # code deltas had none before issue 26
                assert not problems, (rel, problems)
                continue
            assert problems and all(p.startswith(f"{rel}: missing") for p in problems), \
                (rel, problems)


@pytest.fixture
def small(tmp_path) -> tuple[ckptstore.Store, str]:
    """A store of one commit: ``w`` (a full array), ``b`` (packed)."""
    store = ckptstore.open(tmp_path / "store", options=OPTIONS)
    info = store.commit({"w": torch.randn(128, 64), "b": torch.ones(4)})
    yield store, info.id
    store.close()


@pytest.mark.parametrize("what", ["group", "w", "_packed"])
def test_every_byte_of_a_zarr_json_is_checked(small, what):
    """Every byte changed (by one of three masks: a bit, the case / space bit, the high bit) is
    reported, naming the file: JSON the parser reads the same way included."""
    store, commit = small
    where = (f"{data_dir(commit)}/{ZARR_JSON}" if what == "group"
             else f"{array_dir(commit, what)}/{ZARR_JSON}")
    original = store.storage.read(where)
    for i in range(len(original)):
        mutated = bytearray(original)
        mutated[i] ^= (0x01, 0x20, 0x80)[i % 3]
        store.storage.put(where, bytes(mutated))
        problems = store.verify(commit).problems
        assert len(problems) == 1 and problems[0].startswith(f"{where}: "), (i, problems)
    store.storage.put(where, original)
    assert store.verify(commit).ok


def _rewrite(doc: dict, change: str) -> bytes:
    if change == "indented":
        return json.dumps(doc, indent=2).encode()
    if change == "keys reordered":
        return json.dumps(dict(reversed(doc.items()))).encode()
    if change == "escaped":
        return json.dumps(doc).replace('"regular"', '"\\u0072egular"').encode()
    if change == "extra key":
        return json.dumps({**doc, "dimension_names": None}).encode()
    if change == "no storage_transformers":
        return json.dumps({k: v for k, v in doc.items() if k != "storage_transformers"}).encode()
    if change == "fill_value":
        return json.dumps({**doc, "fill_value": 1.0}).encode()
    if change == "attribute":
        doc["attributes"]["ckptstore"]["path"] = "v"
        return json.dumps(doc).encode()
    assert change == "torch dtype"
    doc["attributes"]["ckptstore"]["torch_dtype"] = "bfloat16"
    return json.dumps(doc).encode()


@pytest.mark.parametrize("change", ["indented", "keys reordered", "escaped", "extra key",
                                    "no storage_transformers", "fill_value", "attribute",
                                    "torch dtype"])
def test_array_metadata_other_than_written_is_reported(small, change):
    store, commit = small
    where = f"{array_dir(commit, 'w')}/{ZARR_JSON}"
    store.storage.put(where, _rewrite(json.loads(store.storage.read(where)), change))
    problems = store.verify(commit).problems
    assert len(problems) == 1 and problems[0].startswith(f"{where}: does not match the manifest ("), \
        problems
    if change in ("indented", "keys reordered", "escaped"):
        assert "the same JSON written differently" in problems[0]
    else:
        assert "!=" in problems[0]


@pytest.mark.parametrize("junk", [b"[" * 100_000 + b"]" * 100_000, b'{"a": "' + b"x" * 10**6 + b'"}',
                                  b"\xff\xfe", b"[1, 2]"])
def test_a_hostile_zarr_json_is_a_short_problem(small, junk):
    """Nested beyond the parser's recursion, huge, not UTF-8, not an object: one problem of
    reasonable length, no exception."""
    store, commit = small
    where = f"{array_dir(commit, 'w')}/{ZARR_JSON}"
    store.storage.put(where, junk)
    problems = store.verify(commit).problems
    assert len(problems) == 1 and problems[0].startswith(f"{where}: does not match the manifest (")
    assert len(problems[0]) < 2000


@pytest.mark.parametrize("change", ["indented", "attributes", "extra key"])
def test_group_metadata_other_than_written_is_reported(small, change):
    store, commit = small
    where = f"{data_dir(commit)}/{ZARR_JSON}"
    doc = json.loads(store.storage.read(where))
    doc = {"indented": doc, "attributes": {**doc, "attributes": {"x": 1}},
           "extra key": {**doc, "consolidated_metadata": None}}[change]
    store.storage.put(where, json.dumps(doc, indent=2 if change == "indented" else None).encode())
    problems = store.verify(commit).problems
    assert problems == [p for p in problems if p.startswith(f"{where}: not the zarr v3 group")]
    assert len(problems) == 1
