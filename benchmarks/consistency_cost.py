"""What the checks checkout and verify share (ckptstore/checkout/consistency.py) cost beside them.

A 48-block MLP (Linear + LayerNorm) and its Adam state, committed three times with
``Policy(delta=True)`` (xor chains for the large tensors, packed small ones): the median of 7 runs
of ``check_entries`` over the whole last commit (a fresh walk each time), of ``commit_problems``
(verify's call: the state tree too), of a whole checkout and of verify. ``--against REV`` also
times ``check_entries`` of ``ckptstore/checkout/consistency.py`` as it was at git revision REV, in the
same process: five pairs of medians of 15 runs, the old one then today's. Usage (from the
repository root)::

    .venv/bin/python benchmarks/consistency_cost.py --against 4591ac4
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

import ckptstore
from ckptstore.chains.walk import Walk
from ckptstore.checkout.consistency import check_entries, commit_problems


def _at(rev: str) -> Callable:
    """``check_entries`` of consistency.py at git revision ``rev``."""
    text = subprocess.run(["git", "show", f"{rev}:ckptstore/checkout/consistency.py"], check=True,
                          capture_output=True, text=True).stdout
    text = text.replace("from .", "from ckptstore.")
    path = Path(tempfile.mkdtemp()) / "consistency_at_rev.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("consistency_at_rev", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.check_entries


def _median_ms(fn: Callable[[], object], runs: int = 7) -> float:
    fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return round(1000 * statistics.median(times), 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--against", help="a git revision whose consistency.py to time as well")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(256, 256),
                                                      torch.nn.LayerNorm(256))
                                  for _ in range(48)])
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 256)).sum().backward()
    opt.step()
    root = Path(tempfile.mkdtemp()) / "store"
    policy = ckptstore.Policy(delta=True, min_quant_bytes=65536)
    with ckptstore.open(root) as store:
        for _ in range(3):
            commit = store.commit({"model": model, "optim": opt}, policy=policy).id
    with ckptstore.open(root, create=False) as store:
        m = store.manifest(commit)
        everything = (range(len(m.tensors)), range(len(m.storages)))

        def checks(fn: Callable = check_entries) -> None:
            fn(Walk(store.repo.manifest), m, *everything)

        out = {"entries": len(m.tensors),
               "chains": sum(e.layout.value == "chain" for e in m.tensors)}
        if args.against:
            old = _at(args.against)
            pairs = [(_median_ms(lambda: checks(old), 15), _median_ms(checks, 15))
                     for _ in range(5)]
            out[f"check_entries_ms_at_{args.against}"] = [a for a, _ in pairs]
            out["check_entries_ms"] = [b for _, b in pairs]
        else:
            out["check_entries_ms"] = _median_ms(checks)
        out["commit_problems_ms"] = _median_ms(
            lambda: commit_problems(Walk(store.repo.manifest), m))
        out["checkout_ms"] = _median_ms(lambda: store.checkout(commit))
        out["verify_ms"] = _median_ms(lambda: store.verify(commit))
    print(out)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
