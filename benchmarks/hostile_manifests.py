"""Hostile manifests at random (issue 26 item 8): "verify ok" must mean "checkout will succeed".

A template store holds every layout (arrays, packed, a numpy scalar, tied weights, views), a row
chain, xor chains and a sharded commit. Each trial takes one commit's manifest, changes one
field (``--fields``: that many) at random -- a number to -1, 0, 2**62, 10**12, NaN ...; a string
to another id, name or dtype; a list shortened, lengthened or emptied; a null to a number -- and
stores it again with a valid checksum (what a hostile hand, not damage, makes). Then, on a freshly
opened store: ``checkout`` (whole, and in place), ``verify`` and ``log`` of that commit. Outcomes:

- ``refused``: checkout raises a ckptstore error and verify reports a problem;
- ``reported``: checkout succeeds, verify reports a problem (a lie checkout cannot see, e.g. a
  ``zarr.json`` that no longer matches);
- ``harmless``: both succeed (a message, a size, a time changed);
- ``violations``: checkout raises and verify says ok -- the promise broken;
- ``raw``: anything but a ckptstore error from checkout, verify or log; ``hangs``: a call that
  takes over 60 s.

Usage (from the repository root)::

    .venv/bin/python benchmarks/hostile_manifests.py --count 3000 --seed 1
    .venv/bin/python benchmarks/hostile_manifests.py --count 3000 --seed 5 --fields 2
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import torch

import ckptstore
from ckptstore import EncodingOptions, Policy
from ckptstore.errors import CkptStoreError
from ckptstore.format.layout import manifest_key
from ckptstore.dcp.shards import LocalTensor, commit_shards

OTHER = "0123456789abcdef0123456789abcdef"
_INTS = [-1, 0, 1, 3, 7, 64, 2**31, 2**62, 10**12]
_FLOATS = [float("nan"), float("inf"), -1.0, 1e300, 0.0]
_STRINGS = ["", "float128", "int32", "float64", "uint8", "x", "w", "..", "a/b", OTHER,
            "chain", "packed", "array", "view", "alias", "sharded", "xor", "rows", "residual",
            "numpy-scalar", "numpy"]


def _state(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(1024, 8, generator=torch.Generator().manual_seed(0))
    emb[torch.randperm(1024, generator=g)[:64]] = torch.randn(64, 8, generator=g)
    base = torch.randn(16, 8, generator=g)
    tied = torch.randn(80, generator=g)
    return {"w": torch.randn(3000, generator=g), "m": torch.randn(64, 32, generator=g),
            "b": torch.ones(4) * seed, "s": np.float32(seed), "emb": emb,
            "tied": {"a": tied, "b": tied}, "views": {"base": base, "half": base[::2, 1:]}}


def template(root: Path) -> list[str]:
    """The store every trial changes one manifest of; its commit ids."""
    rows = Policy(incremental="consecutive", min_rows=512, min_quant_bytes=1024)
    xor = Policy(delta=True, min_quant_bytes=1024)
    with ckptstore.open(root, options=EncodingOptions(chunk_bytes=4096, pack_below=256)) as s:
        ids = [s.commit(_state(1), policy=rows).id, s.commit(_state(2), policy=rows).id,
               s.commit(_state(3), policy=xor).id, s.commit(_state(4), policy=xor).id]
        g, sb = torch.randn(64, 8), torch.randn(8)
        ids.append(commit_shards(s, [
            [LocalTensor("g", (32 * r, 0), (64, 8), g[32 * r: 32 * r + 32]),
             LocalTensor("sb", (4 * r,), (8,), sb[4 * r: 4 * r + 4])] for r in range(2)]).id)
    return ids


def _leaves(node: Any, path: tuple = ()) -> list[tuple]:
    """Paths of every value in a decoded manifest (containers included)."""
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _leaves(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _leaves(v, (*path, i))
    return out


def _hostile(value: Any, rng: random.Random, ids: list[str]) -> Any:
    if isinstance(value, bool) or value is None:
        return rng.choice([0, 1, "x", None if value is not None else True])
    if isinstance(value, int):
        return rng.choice(_INTS + [value + 1, value - 1, value * 2**20])
    if isinstance(value, float):
        return rng.choice(_FLOATS)
    if isinstance(value, str):
        return rng.choice(_STRINGS + ids)
    if isinstance(value, list):
        kind = rng.randrange(4)
        if kind == 0 or not value:
            return []
        if kind == 1:
            return value[:-1]
        if kind == 2:
            return [*value, value[-1]]
        return [rng.choice(_INTS) if isinstance(v, int) else v for v in value]
    if isinstance(value, dict):
        return {}
    return value


def mutate(data: bytes, rng: random.Random, ids: list[str], fields: int = 1
           ) -> tuple[bytes, str]:
    """``fields`` fields of a manifest changed, framed with a valid checksum; what changed."""
    raw = msgpack.unpackb(data[37:], strict_map_key=False)
    changes = []
    for _ in range(fields):
        path = rng.choice(_leaves(raw)[1:])
        parent = raw
        for k in path[:-1]:
            parent = parent[k]
        old = parent[path[-1]]
        parent[path[-1]] = new = _hostile(old, rng, ids)
        changes.append(f"{'.'.join(map(str, path))}: {str(old)[:40]} -> {str(new)[:40]}")
    payload = msgpack.packb(raw, use_bin_type=True)
    return data[:5] + hashlib.sha256(payload).digest() + payload, "; ".join(changes)


class _Hang(Exception):
    pass


def _alarm(*_: object) -> None:
    raise _Hang


def trial(root: Path, commit: str, in_place: bool) -> str:
    """The outcome of checking out (``in_place``: also into a live state of the template's
    shapes), verifying and logging ``commit`` of the store at ``root``."""
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(60)
    try:
        with ckptstore.open(root, create=False) as store:
            refused = False
            try:
                store.checkout(commit)
            except CkptStoreError:
                refused = True
            try:  # a live state that no longer matches the commit is refused too: not counted
                if in_place:
                    store.checkout(commit, into=_state(9))
            except CkptStoreError:
                pass
            ok = store.verify(commit).ok
            try:
                store.log(commit)
            except CkptStoreError:
                pass
    except _Hang:
        return "hangs"
    except Exception as e:  # noqa: BLE001 - what the campaign counts
        return f"raw: {type(e).__name__}: {str(e)[:120]}"
    finally:
        signal.alarm(0)
    if refused:
        return "refused" if not ok else "violations"
    return "harmless" if ok else "reported"


def run(count: int, seed: int, fields: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        ids = template(root)
        originals = {c: (root / manifest_key(c)).read_bytes() for c in ids}
        outcomes: Counter[str] = Counter()
        bad: list[str] = []
        start = time.perf_counter()
        for _ in range(count):
            commit = rng.choice(ids)
            data, what = mutate(originals[commit], rng, ids, fields)
            (root / manifest_key(commit)).write_bytes(data)
            outcome = trial(root, commit, commit != ids[-1])  # not the sharded one
            (root / manifest_key(commit)).write_bytes(originals[commit])
            outcomes[outcome.split(":")[0]] += 1
            if outcome.split(":")[0] in ("violations", "raw", "hangs"):
                bad.append(f"{what} => {outcome}")
        seconds = time.perf_counter() - start
    return {"tried": count, "fields": fields, **{k: outcomes.get(k, 0) for k in (
        "refused", "reported", "harmless", "violations", "raw", "hangs")},
        "seconds": round(seconds, 1), "per_trial_ms": round(1000 * seconds / max(count, 1), 1),
        "failures": bad}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fields", type=int, default=1, help="fields changed per trial")
    args = p.parse_args()
    torch.set_num_threads(1)
    result = run(args.count, args.seed, args.fields)
    json.dump(result, sys.stdout, indent=1)
    print()
    if result["violations"] or result["raw"] or result["hangs"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
