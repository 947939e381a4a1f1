"""The GPU writer side by side (issue 11): training slowdown, stall and host staging of
asynchronous checkpoints of a transformer's training state, and restores straight to the GPU.

Usage::

    python benchmarks/gpu.py                        # on a CUDA machine (~10 minutes on an H100)
    python benchmarks/gpu.py --layers 12 --width 1024 --steps 200 --every 50
    python benchmarks/gpu.py --device cpu --layers 2 --width 128 --steps 12 --every 4   # smoke

What is measured
----------------
* The state: a ``--layers`` x ``--width`` transformer encoder (fp32 weights, bf16 autocast on
  CUDA) and its AdamW moments -- about 12 bytes a parameter (2.6 GB for 12 x 1536).
* Training: ``--steps`` steps of random token batches; a checkpoint every ``--every`` steps.
  The slowdown of each configuration is its wall time over the time without checkpoints (the
  last checkpoint's persist is waited for inside the timed run). Configurations, in one run,
  interleaved round by round:

  - ``bare copy``: every tensor copied into preallocated pinned buffers on a side stream (what
    any asynchronous checkpoint must at least do);
  - ``commit_async`` lossless (the default byte planes);
  - ``commit_async`` 8-bit uniform and 4-bit adaptive, quantized on the GPU
    (``device_encode="auto"``, the default) and, for comparison, on the host
    (``device_encode="off"``: the whole state crosses PCIe at full precision first);
  - ``commit_async`` incremental (intermittent) + 4-bit adaptive: the changed rows found on the
    GPU against a reference kept there;
  - ``dcp.async_save`` (FileSystemWriter) and ``torch.save``.

  Also the median stall -- from the call until the training stream could run its next kernel
  (the call, then what it made the training stream wait for on the device; the step's own
  kernels are drained first) -- and the store's staging bytes.
* Restore to the GPU of the model's weights: ``torch.load`` + ``.cuda()`` of a ``torch.save``
  file against ``store.checkout(ref, map_location=device)`` of a lossless, 8-bit and 4-bit
  commit (quantized commits are dequantized on the GPU, :mod:`ckptstore.device.decode`), medians.

Goals (issue 11): every policy at most 1.1x the bare copy's slowdown, compressed ones below it;
restore to the GPU at least 2x faster than ``torch.load`` + ``.cuda()``.
With ``--device cpu`` the same code runs on the CPU (a smoke test of the script, not the goals).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import command_line, human_bytes, machine_description, markdown_table  # noqa: E402

import ckptstore  # noqa: E402
from ckptstore import EncodingOptions, Policy, QuantSpec  # noqa: E402

U8 = QuantSpec("uniform-asymmetric", 8)
A4 = QuantSpec("adaptive-asymmetric", 4)
STORES: dict[str, tuple[str, Policy]] = {
    "commit_async lossless": ("auto", Policy()),
    "commit_async 8-bit uniform, on the GPU": ("auto", Policy(quantize=U8)),
    "commit_async 8-bit uniform, on the host": ("off", Policy(quantize=U8)),
    "commit_async 4-bit adaptive, on the GPU": ("auto", Policy(quantize=A4)),
    "commit_async 4-bit adaptive, on the host": ("off", Policy(quantize=A4)),
    # the incremental + 4-bit: rows found on the GPU against a reference kept there
    # (AdamW moves every row of a transformer's tables: the increments are whole tables)
    "commit_async incremental + 4-bit adaptive": (
        "auto", Policy(incremental="intermittent", quantize=A4)),
}


class Trainer:
    """A transformer encoder, AdamW, random token batches."""

    def __init__(self, layers: int, width: int, batch: int, seq: int, device: str):
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(width, max(width // 64, 1), 4 * width,
                                           batch_first=True)
        self.model = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.x = torch.randn(batch, seq, width, device=device)
        self.device = device
        self.step()  # AdamW's moments exist from here on

    def step(self) -> None:
        with torch.autocast(self.device.split(":")[0], dtype=torch.bfloat16,
                            enabled=self.device.startswith("cuda")):
            loss = self.model(self.x).float().pow(2).mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optim": self.opt.state_dict()}

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in _leaves(self.state()) if isinstance(t, torch.Tensor)]


def _leaves(node: Any) -> list[Any]:
    if isinstance(node, dict):
        return [x for v in node.values() for x in _leaves(v)]
    if isinstance(node, (list, tuple)):
        return [x for v in node for x in _leaves(v)]
    return [node]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _training_stream_idle(device: str) -> None:
    """Wait until the training stream could run its next kernel (what a checkpoint made it wait
    for on the device included)."""
    if device.startswith("cuda"):
        torch.cuda.current_stream(device).synchronize()


class BareCopy:
    """Every tensor copied into preallocated (pinned) buffers, on a side stream on CUDA."""

    def __init__(self, tr: Trainer):
        cuda = tr.device.startswith("cuda")
        self.buffers = [torch.empty(t.shape, dtype=t.dtype, pin_memory=cuda)
                        for t in tr.tensors()]
        self.stream = torch.cuda.Stream(tr.device) if cuda else None
        self.tr = tr

    def __call__(self) -> None:
        tensors = self.tr.tensors()
        if self.stream is None:
            for b, t in zip(self.buffers, tensors, strict=True):
                b.copy_(t)
            return
        training = torch.cuda.current_stream(self.tr.device)
        self.stream.wait_stream(training)
        with torch.cuda.stream(self.stream):
            for b, t in zip(self.buffers, tensors, strict=True):
                b.copy_(t, non_blocking=True)
        training.wait_stream(self.stream)  # the next step may not change what is being copied


def _checkpointers(tr: Trainer, root: str) -> dict[str, Callable[[], Callable[[], Any]]]:
    """name -> factory of ``(checkpoint(), finish())`` pairs for one timed run."""
    import torch.distributed.checkpoint as dcp

    def store_run(mode: str, policy: Policy) -> Callable[[], Any]:
        def make() -> tuple[Callable[[], Any], Callable[[], Any], Any]:
            store = ckptstore.open(tempfile.mkdtemp(dir=root),
                                   options=EncodingOptions(device_encode=mode), policy=policy)
            store.commit_async(tr.state()).wait()  # warm: buffers, compiled kernels, streams
            return (lambda: store.commit_async(tr.state())), store.close, store
        return make

    def bare() -> tuple[Callable[[], Any], Callable[[], Any], Any]:
        copy = BareCopy(tr)
        return copy, (lambda: _sync(tr.device)), None

    def dcp_async() -> tuple[Callable[[], Any], Callable[[], Any], Any]:
        folder = tempfile.mkdtemp(dir=root)
        futures: list[Any] = []

        def save() -> None:
            for f in futures:
                f.result()
            futures.append(dcp.async_save(tr.state(), checkpoint_id=folder))
        return save, (lambda: [f.result() for f in futures]), None

    def torch_save() -> tuple[Callable[[], Any], Callable[[], Any], Any]:
        path = os.path.join(tempfile.mkdtemp(dir=root), "ckpt.pt")
        return (lambda: torch.save(tr.state(), path)), (lambda: None), None

    out: dict[str, Callable[[], Any]] = {"bare copy": bare}
    out |= {name: store_run(mode, policy) for name, (mode, policy) in STORES.items()}
    out |= {"dcp.async_save": dcp_async, "torch.save": torch_save}
    return out


def timed_run(tr: Trainer, steps: int, every: int, make: Callable[[], Any] | None
              ) -> tuple[float, list[float], tuple[int, int] | None]:
    """``(seconds, stalls, staging bytes on the host and on the device)`` of ``steps`` training steps with a checkpoint every
    ``every`` steps (none if ``make`` is None)."""
    save, finish, store = make() if make is not None else (None, None, None)
    stalls: list[float] = []
    _sync(tr.device)
    t0 = time.perf_counter()
    for s in range(1, steps + 1):
        tr.step()
        if save is not None and s % every == 0:
            _sync(tr.device)  # the step's own kernels done: what follows is the checkpoint's
            t1 = time.perf_counter()
            save()
            # the stall: the call, then whatever the training stream now waits for on the device
            # (a CPU timer alone would see only the launch of asynchronous copies)
            _training_stream_idle(tr.device)
            stalls.append(time.perf_counter() - t1)
    staging = (store.staging_bytes, store.staging_device_bytes) if store is not None else None
    if finish is not None:
        finish()
    _sync(tr.device)
    return time.perf_counter() - t0, stalls, staging


def restore_rows(tr: Trainer, root: str, repeat: int) -> list[list[str]]:
    """Restore of the model's weights to the device: torch.load + .to(device) against
    checkout(map_location=device)."""
    weights = tr.model.state_dict()
    device = tr.device
    path = os.path.join(root, "weights.pt")
    torch.save(weights, path)

    def torch_load() -> None:
        sd = torch.load(path, map_location="cpu", weights_only=True)
        [t.to(device) for t in sd.values()]
        _sync(device)

    cases: dict[str, Callable[[], None]] = {"torch.load + .to(device)": torch_load}
    for name, spec in (("lossless", None), ("8-bit uniform", U8), ("4-bit adaptive", A4)):
        store = ckptstore.open(tempfile.mkdtemp(dir=root), policy=Policy(quantize=spec))
        ref = store.commit(weights).id

        def checkout(store: Any = store, ref: str = ref) -> None:
            store.checkout(ref, map_location=device)
            _sync(device)
        cases[f"checkout {name}"] = checkout
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeat):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["torch.load + .to(device)"])
    return [[name, f"{1e3 * statistics.median(v):.0f}", f"{base / statistics.median(v):.2f}×"]
            for name, v in times.items()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (the benchmark) or cpu (a smoke run)")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=1536)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=2, help="interleaved rounds")
    ap.add_argument("--only", nargs="*", help="configurations to run (default: all)")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", module="torch.distributed.checkpoint")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("skipped: no CUDA device (use --device cpu for a smoke run)", file=sys.stderr)
        return 0
    print(f"# {command_line(__file__, argv)}\n# {machine_description()}")
    if args.device.startswith("cuda"):
        print(f"# device: {torch.cuda.get_device_name(0)}")
    root = tempfile.mkdtemp(prefix="gpu-bench-")
    try:
        tr = Trainer(args.layers, args.width, args.batch, args.seq, args.device)
        nbytes = sum(t.numel() * t.element_size() for t in tr.tensors())
        print(f"# state: {human_bytes(nbytes)} ({len(tr.tensors())} tensors)\n")
        configs = _checkpointers(tr, root)
        if args.only:
            configs = {k: v for k, v in configs.items() if k in args.only}
        runs: dict[str, list[tuple[float, list[float], tuple[int, int] | None]]] = {
            "none": []}
        runs |= {k: [] for k in configs}
        timed_run(tr, args.every, args.every, None)  # warm-up (kernels, allocator)
        for r in range(args.repeat):
            order = ["none", *configs] if r % 2 == 0 else [*reversed(configs), "none"]
            for name in order:
                runs[name].append(timed_run(tr, args.steps, args.every,
                                            configs.get(name)))
                print(f"round {r + 1}: {name}: {runs[name][-1][0]:.2f} s", file=sys.stderr,
                      flush=True)
        base = statistics.median(s for s, _, _ in runs["none"])
        bare = statistics.median(s for s, _, _ in runs["bare copy"]) - base \
            if "bare copy" in runs else None
        rows = []
        for name, rs in runs.items():
            seconds = statistics.median(s for s, _, _ in rs)
            stalls = [x for _, st, _ in rs for x in st]
            extra = seconds - base
            rows.append([name, f"{seconds:.2f}", "–" if name == "none" else
                         f"{100 * extra / base:+.1f} %",
                         "–" if not bare or name in ("none", "bare copy") else
                         f"{extra / bare:.2f}×",
                         f"{1e3 * statistics.median(stalls):.1f}" if stalls else "–",
                         *([human_bytes(rs[-1][2][0]), human_bytes(rs[-1][2][1])] if rs[-1][2]
                           else ["–", "–"])])
        print(markdown_table(["configuration", "seconds", "slowdown", "slowdown / bare copy's",
                              "median stall ms", "host staging", "device staging"], rows,
                             "lrrrrrr"))
        print()
        print(markdown_table(["restore of the weights", "ms", "vs torch.load"],
                             restore_rows(tr, root, max(args.repeat, 3)), "lrr"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
