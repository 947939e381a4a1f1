"""Peak memory of loading a checkpoint in place: ``store.checkout(ref, into=...)`` beside
``dcp.load`` and ``torch.load`` + ``load_state_dict`` (issue 26, item 15).

The same state (a ``torch.nn.Sequential`` of ``--mib / 16`` float32 ``Linear(2048, 2048)``
layers, under ``"model"``) is written once by each library. Each load then runs in a fresh
Python process holding the live model (every page written) and loads the way each library is
used: ``checkout(into={"model": model})`` and into the plain ``model.state_dict()``,
``dcp.load({"model": model.state_dict()})``, ``model.load_state_dict(torch.load(...)["model"])``,
and ``checkout(into={"model": model})`` of the last of four commits that make an XOR chain
(``Policy(delta=True)``, every value moved a little) or a rows chain
(``Policy(incremental="consecutive")``, 1% of the rows changed per commit).
Before it, the process loads a one-layer model the same way (what a library pays once: imports,
compiled kernels, thread pools; reported apart). The measure is the peak resident set size
over the RSS just before the load (``VmHWM`` after it, the kernel's peak reset just before,
minus ``VmRSS``), and the load's wall time. ``--other-src PATH`` adds a run of another
ckptstore source tree (an older commit, ``git archive`` into PATH) on the same store::

    .venv/bin/python benchmarks/inplace_memory.py --mib 864
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import load_average, machine_description, markdown_table

LAYER = [2048, 2048]  # 16 MiB of float32 (--layer-mib sets the first: output features)
CHAINS = {"xor chain": "xor", "rows chain": "rows"}  # kind suffix -> the store holding that chain
KINDS = ["ckptstore checkout(into=module)", "ckptstore checkout(into=state_dict)",
         "ckptstore checkout(into=module), xor chain",
         "ckptstore checkout(into=module), rows chain",
         "dcp.load", "torch.load + load_state_dict", "torch.load(mmap=True) + load_state_dict"]
LINKS = 4  # commits of each chain store: a baseline and three chain entries


def _model(mib: int, fill: float | None = 0.5):  # noqa: ANN202 - torch is imported late
    import torch
    layers = [torch.nn.Linear(*LAYER) for _ in range(_layers(mib))]
    model = torch.nn.Sequential(*layers)
    if fill is not None:
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(fill)
    return model


def _layers(mib: int) -> int:
    """How many layers of LAYER make about ``mib`` MiB (at least one)."""
    return max(1, round(mib * 2**20 / (4 * LAYER[0] * LAYER[1])))


def _status(field: str) -> int:
    """A size from /proc/self/status, in bytes (``VmRSS``, ``VmHWM``: the peak)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def _reset_peak() -> bool:
    """Reset the kernel's peak RSS of this process (Linux: ``5`` to ``clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _sums(state) -> dict[str, float]:  # noqa: ANN001
    return {k: float(v.double().sum()) for k, v in state.items()}


def _write_chain(path: Path, state, chain: str) -> dict[str, float]:  # noqa: ANN001
    """``LINKS`` commits of ``state`` under ``Policy(delta=True)`` (``xor``: every value moved a
    little between commits) or ``Policy(incremental="consecutive")`` (``rows``: 1% of the rows
    of each matrix changed), each commit after the first a chain entry; the last state's sums."""
    import torch

    import ckptstore
    policy = (ckptstore.Policy(delta=True) if chain == "xor"
              else ckptstore.Policy(incremental="consecutive"))
    store = ckptstore.open(str(path), policy=policy)
    g = torch.Generator().manual_seed(1)
    for link in range(LINKS):
        if link:
            for v in state.values():
                if chain == "xor":
                    v.mul_(1 + 1e-3 * torch.rand(v.shape, generator=g))
                elif v.dim() == 2:
                    v[torch.randint(0, v.shape[0], (v.shape[0] // 100,), generator=g)] += 1
        store.commit({"model": state})
    return _sums(state)


def write(root: Path, mib: int) -> dict[str, dict[str, float]]:
    """The state, written by ckptstore, DCP and torch.save, and as chains by ckptstore; the
    checksums a load must give, by store (``state`` for the first three)."""
    import torch
    import torch.distributed.checkpoint as dcp

    import ckptstore
    torch.manual_seed(0)
    state = _model(mib, None).state_dict()
    root.mkdir(parents=True)
    ckptstore.open(str(root / "store")).commit({"model": state})
    dcp.save({"model": state}, checkpoint_id=str(root / "dcp"))
    torch.save({"model": state}, root / "torch.pt")
    sums = {"state": _sums(state)}
    for chain in CHAINS.values():
        sums[chain] = _write_chain(root / chain, {k: v.clone() for k, v in state.items()}, chain)
    return sums


def _store_of(kind: str) -> str:
    """The folder of the ckptstore store ``kind`` loads (``store``, or a chain's)."""
    return next((folder for suffix, folder in CHAINS.items() if suffix in kind), "store")


def _load(kind: str, root: Path, model, store) -> None:  # noqa: ANN001
    """Load the checkpoint under ``root`` into ``model`` the way ``kind`` is used."""
    import torch
    import torch.distributed.checkpoint as dcp
    if kind.startswith("ckptstore"):
        store.checkout("main", into={"model": model.state_dict() if "state_dict" in kind
                                     else model})
    elif kind == "dcp.load":
        dcp.load({"model": model.state_dict()}, checkpoint_id=str(root / "dcp"))
    else:
        got = torch.load(root / "torch.pt", weights_only=True, mmap="mmap" in kind)
        model.load_state_dict(got["model"])
        del got


def _extra(fn) -> tuple[int, float]:  # noqa: ANN001
    """``fn()``'s peak RSS over the RSS before it, and its seconds."""
    gc.collect()
    before = _status("VmRSS")
    peak0 = before if _reset_peak() else _status("VmHWM")
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    return _status("VmHWM") - max(peak0, before), seconds


def child(kind: str, root: Path, mib: int) -> None:
    """One load in this (fresh) process, after a first one of a one-layer model from
    ``root/warm`` (what a library pays once: imports, compiled kernels, thread pools); prints
    both measures as JSON."""
    import warnings
    warnings.filterwarnings("ignore")
    stores = {}
    if kind.startswith("ckptstore"):
        import ckptstore
        for part in ("warm", "main"):
            stores[part] = ckptstore.open(str(root / part / _store_of(kind)), create=False)
            stores[part].manifest(stores[part].resolve("main"))
    warm = _model(16)
    first, _ = _extra(lambda: _load(kind, root / "warm", warm, stores.get("warm")))
    del warm
    model = _model(mib)
    extra, seconds = _extra(lambda: _load(kind, root / "main", model, stores.get("main")))
    sums = {k: float(v.double().sum()) for k, v in model.state_dict().items()}
    print(json.dumps({"baseline": _status("VmRSS"), "first": first, "extra": extra,
                      "seconds": seconds, "sums": sums}))


def run(kind: str, root: Path, mib: int, src: str | None = None) -> dict:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    out = subprocess.run([os.path.abspath(sys.executable), os.path.abspath(__file__), "--child",
                          kind, "--root", str(root), "--mib", str(mib),
                          "--layer-mib", str(LAYER[0] * LAYER[1] * 4 // 2**20)], env=env,
                         capture_output=True, text=True, cwd=src or None)
    if out.returncode:
        raise SystemExit(f"{kind} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=864, help="state size in MiB (default 864)")
    ap.add_argument("--layer-mib", type=int, default=16,
                    help="MiB of one layer's weight (default 16: Linear(2048, 2048))")
    ap.add_argument("--other-src", help="another ckptstore source tree to run as well (its "
                    "checkout(into=module) rows)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    args = ap.parse_args()
    LAYER[0] = args.layer_mib * 2**20 // (4 * LAYER[1])
    if args.child:
        child(args.child, Path(args.root), args.mib)
        return
    with tempfile.TemporaryDirectory(prefix="inplace_memory_") as tmp:
        root = Path(tmp)
        write(root / "warm", 16)
        sums = write(root / "main", args.mib)
        runs = [(k, None) for k in KINDS]
        if args.other_src:  # every checkout(into=module) again, from the other tree
            runs += [(f"{k}, {args.other_src}", args.other_src) for k in KINDS
                     if k.startswith("ckptstore checkout(into=module)")]
        rows = []
        for kind, src in runs:
            got = run(kind, root, args.mib, src)
            want = sums[_store_of(kind) if _store_of(kind) != "store" else "state"]
            ok = all(abs(got["sums"][k] - v) <= 1e-6 * max(1.0, abs(v)) for k, v in want.items())
            rows.append([kind, f"{got['first'] / 2**20:.0f}", f"{got['extra'] / 2**20:.0f}",
                         f"{got['seconds']:.2f}", "yes" if ok else "NO"])
    size = _layers(args.mib) * 4 * (LAYER[0] * LAYER[1] + LAYER[0])
    print(f"state: {size / 2**20:.0f} MiB of float32 in layers of {LAYER[0]}x{LAYER[1]}; "
          f"{machine_description()}; load average {load_average()}")
    print(markdown_table(["load in place", "first load (one layer) MiB", "peak over baseline MiB",
                          "seconds", "state right"], rows))


if __name__ == "__main__":
    main()
