"""The GPU writer side by side (issues 11 and 30): training slowdown, stall and host staging of
asynchronous checkpoints of a transformer's training state, and restores straight to the GPU.

Usage::

    python benchmarks/gpu.py               # on a CUDA machine (2.6 GB, ~4 minutes on an H100)
    python benchmarks/gpu.py --layers 26 --width 1536 --first-commit   # the 8.8 GB state
    python benchmarks/gpu.py --device cpu --layers 2 --width 128 --every 4 --checkpoints 2  # smoke

What is measured
----------------
* The state: a ``--layers`` x ``--width`` transformer encoder (fp32 weights, bf16 autocast on
  CUDA) and its AdamW moments -- 12 bytes a parameter (2.6 GB for 12 x 1216, 0.85 GB of weights;
  8.8 GB for 26 x 1536).
* Training: random token batches; a checkpoint at the start of every ``--every`` steps
  (default: the steps of ``--every-seconds``, measured after a warm-up), ``--checkpoints`` of
  them a run, so every interval holds one checkpoint whose persist overlaps its steps, as in a
  long run (a persist slower than the interval shows as the next checkpoint's stall). The
  slowdown of each configuration is its time to the last step over the time without
  checkpoints; the drain (waiting for the last persist after it) is printed apart. Also the
  run's time over the bare copy's; the ratio of slowdowns only where the bare copy's is above 2 %
  of the run (below, it is noise). Configurations, in one run, interleaved round by round:

  - ``bare copy``: every tensor copied into preallocated pinned buffers on a side stream (what
    any asynchronous checkpoint must at least do);
  - ``commit_async`` lossless (the default byte planes), and the same with the snapshot in
    pinned host memory (``device_encode="off"``: a GPU without room for it);
  - ``commit_async`` 8-bit uniform and 4-bit adaptive, quantized on the GPU
    (``device_encode="auto"``, the default) and, for comparison, on the host
    (``device_encode="off"``: the whole state crosses PCIe at full precision first);
  - ``commit_async`` incremental (intermittent) + 4-bit adaptive: the changed rows found on the
    GPU against a reference kept there;
  - ``commit_async`` lossless and 8-bit with the persist in a process of the store's own
    (``background="process"``: no interpreter lock shared with the loop);
  - ``dcp.async_save`` (FileSystemWriter) and ``torch.save``.

  Also the median stall -- from the call until the training stream could run its next kernel
  (the call, then what it made the training stream wait for on the device; the step's own
  kernels are drained first) -- against the bare copy's, and the store's staging bytes. Stores
  keep their latest 2 commits (``keep=LatestN(2)``), so disks hold a run of the large state.
* With ``--first-commit``: the stall of the first ``commit_async`` of a fresh store against the
  next ones (the staging buffers allocated, or reused), with and without ``Store.reserve``
  called ahead, with the snapshot in spare device memory (``device_encode="auto"``) and in
  pinned host memory (``"off"``). Goal (issue 30): the first at most 2x the next.
* Restore to the GPU of the model's weights: ``torch.load`` + ``.cuda()`` of a ``torch.save``
  file against ``store.checkout(ref, map_location=device)`` of a lossless, 8-bit and 4-bit
  commit (quantized commits are dequantized on the GPU, :mod:`ckptstore.device.decode`),
  medians; with ``--profile-restore``, the 8-bit checkout's time split between its host part
  and its device part, summed over its threads.

Goals (issues 11 and 30): every policy at most 1.1x the bare copy's slowdown; the stall at most
5 ms with the snapshot in spare device memory, else at most 1.2x the bare copy's; restore to the
GPU at least 2x faster than ``torch.load`` + ``.cuda()``.
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
from ckptstore import EncodingOptions, LatestN, Policy, QuantSpec  # noqa: E402

U8 = QuantSpec("uniform-asymmetric", 8)
A4 = QuantSpec("adaptive-asymmetric", 4)
# name -> (device_encode, policy[, background]): background "thread" (the default) or "process"
STORES: dict[str, tuple[Any, ...]] = {
    "commit_async lossless": ("auto", Policy()),
    # the snapshot in pinned host memory (a GPU without room for it): a device-to-host copy
    "commit_async lossless, staged on the host": ("off", Policy()),
    "commit_async 8-bit uniform, on the GPU": ("auto", Policy(quantize=U8)),
    "commit_async 8-bit uniform, on the host": ("off", Policy(quantize=U8)),
    "commit_async 4-bit adaptive, on the GPU": ("auto", Policy(quantize=A4)),
    "commit_async 4-bit adaptive, on the host": ("off", Policy(quantize=A4)),
    # the incremental + 4-bit: rows found on the GPU against a reference kept there
    # (AdamW moves every row of a transformer's tables: the increments are whole tables)
    "commit_async incremental + 4-bit adaptive": (
        "auto", Policy(incremental="intermittent", quantize=A4)),
    # the persist in a process of the store's own (no GIL shared with the training loop; the
    # snapshot copied into shared memory, pageable: the host encodes, as device_encode="off")
    "commit_async lossless, in a persist process": ("off", Policy(), "process"),
    "commit_async 8-bit uniform, in a persist process": ("off", Policy(quantize=U8), "process"),
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


#: a configuration's (checkpoint(), finish(), store or None), and what makes it under a folder
Run = tuple[Callable[[], Any], Callable[[], Any], Any]
Factory = Callable[[str], Run]


def _checkpointers(tr: Trainer) -> dict[str, Factory]:
    """name -> factory of ``(checkpoint(), finish(), store or None)`` writing under a folder."""
    import torch.distributed.checkpoint as dcp

    def store_run(mode: str, policy: Policy, background: str = "thread") -> Factory:
        def make(folder: str) -> Run:
            store = ckptstore.open(folder, keep=LatestN(2), background=background,
                                   options=EncodingOptions(device_encode=mode), policy=policy)
            store.commit_async(tr.state()).wait()  # warm: buffers, compiled kernels, streams
            return (lambda: store.commit_async(tr.state())), store.close, store
        return make

    def bare(folder: str) -> Run:
        copy = BareCopy(tr)
        return copy, (lambda: _sync(tr.device)), None

    def dcp_async(folder: str) -> Run:
        futures: list[Any] = []

        def save() -> None:
            for f in futures:
                f.result()
            futures.append(dcp.async_save(tr.state(), checkpoint_id=folder))
        return save, (lambda: [f.result() for f in futures]), None

    def torch_save(folder: str) -> Run:
        path = os.path.join(folder, "ckpt.pt")
        return (lambda: torch.save(tr.state(), path)), (lambda: None), None

    out: dict[str, Factory] = {"bare copy": bare}
    out |= {name: store_run(*how) for name, how in STORES.items()}
    out |= {"dcp.async_save": dcp_async, "torch.save": torch_save}
    return out


def timed_run(tr: Trainer, steps: int, every: int, make: Factory | None, root: str
              ) -> tuple[float, list[float], tuple[int, int] | None, float]:
    """``(seconds, stalls, staging bytes on the host and on the device, drain seconds)`` of
    ``steps`` training steps with a checkpoint at the start of every ``every`` steps (none if
    ``make`` is None): every interval holds one checkpoint, whose persist overlaps its steps as
    in a long run (a persist slower than the interval shows as the next checkpoint's stall).
    The drain -- waiting for the last persist after the last step -- is timed apart; what the
    run wrote is removed after it."""
    folder = tempfile.mkdtemp(dir=root)
    try:
        save, finish, store = make(folder) if make is not None else (None, None, None)
        stalls: list[float] = []
        _sync(tr.device)
        t0 = time.perf_counter()
        for s in range(steps):
            if save is not None and s % every == 0:
                _sync(tr.device)  # the steps' own kernels done: what follows is the checkpoint's
                t1 = time.perf_counter()
                save()
                # the stall: the call, then whatever the training stream now waits for on the
                # device (a CPU timer alone would see only the launch of asynchronous copies)
                _training_stream_idle(tr.device)
                stalls.append(time.perf_counter() - t1)
            tr.step()
        _sync(tr.device)
        seconds = time.perf_counter() - t0
        staging = (store.staging_bytes, store.staging_device_bytes) if store is not None \
            else None
        t1 = time.perf_counter()
        if finish is not None:
            finish()
        _sync(tr.device)
        return seconds, stalls, staging, time.perf_counter() - t1
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _free_cached_buffers(device: str) -> None:
    """Give back what torch's caching allocators keep of freed device and pinned buffers."""
    import gc

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        getattr(torch._C, "_host_emptyCache", lambda: None)()


def first_commit_rows(tr: Trainer, root: str, commits: int = 3) -> list[list[str]]:
    """The first ``commit_async`` stall of a fresh store against the next ones', with and
    without ``Store.reserve`` ahead, the snapshot in spare device memory or pinned host memory."""
    rows = []
    for mode, where in (("auto", "spare device memory"), ("off", "pinned host memory")):
        for reserve in (False, True):
            _free_cached_buffers(tr.device)  # a fresh process's first commit, not a reuse
            folder = tempfile.mkdtemp(dir=root)
            store = ckptstore.open(folder, keep=LatestN(1),
                                   options=EncodingOptions(device_encode=mode,
                                                           compression="none"))
            try:
                reserved = 0.0
                if reserve:
                    t0 = time.perf_counter()
                    store.reserve(tr.state()).result()
                    reserved = time.perf_counter() - t0
                stalls = []
                for _ in range(commits):
                    tr.step()
                    _sync(tr.device)
                    t0 = time.perf_counter()
                    pending = store.commit_async(tr.state())
                    _training_stream_idle(tr.device)
                    stalls.append(time.perf_counter() - t0)
                    pending.wait()
            finally:
                store.close()
                shutil.rmtree(folder, ignore_errors=True)
            first, steady = stalls[0], statistics.median(stalls[1:])
            print(f"first commit, {where}, reserve={reserve}: {1e3 * first:.0f} ms, next "
                  f"{1e3 * steady:.0f} ms", file=sys.stderr, flush=True)
            rows.append([where, "store.reserve(state) first" if reserve else "none",
                         f"{1e3 * first:.0f}", f"{1e3 * steady:.1f}", f"{first / steady:.2f}×",
                         f"{1e3 * reserved:.0f}" if reserve else "–"])
    return rows


def restore_rows(tr: Trainer, root: str, repeat: int, profile: bool = False
                 ) -> list[list[str]]:
    """Restore of the model's weights to the device: torch.load + .to(device) against
    checkout(map_location=device); ``profile``: then the 8-bit checkout once more under
    cProfile with one I/O worker (where its time goes, function by function, to stderr)."""
    weights = tr.model.state_dict()
    device = tr.device
    path = os.path.join(root, "weights.pt")
    torch.save(weights, path)

    def torch_load() -> None:
        sd = torch.load(path, map_location="cpu", weights_only=True)
        [t.to(device) for t in sd.values()]
        _sync(device)

    cases: dict[str, Callable[[], None]] = {"torch.load + .to(device)": torch_load}
    stores: dict[str, Any] = {}
    for name, spec in (("lossless", None), ("8-bit uniform", U8), ("4-bit adaptive", A4)):
        store = ckptstore.open(tempfile.mkdtemp(dir=root), policy=Policy(quantize=spec))
        ref = store.commit(weights).id
        stores[name] = store

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
    if profile:
        _profile_checkout(stores["8-bit uniform"], device)
    base = statistics.median(times["torch.load + .to(device)"])
    return [[name, f"{1e3 * statistics.median(v):.0f}", f"{base / statistics.median(v):.2f}×"]
            for name, v in times.items()]


def _every(tr: Trainer, seconds: float) -> tuple[int, float]:
    """The steps of about ``seconds`` of training, and one step's seconds (after a warm-up)."""
    for _ in range(3):
        tr.step()
    _sync(tr.device)
    t0 = time.perf_counter()
    for _ in range(10):
        tr.step()
    _sync(tr.device)
    step = (time.perf_counter() - t0) / 10
    return max(1, round(seconds / step)), step


def _profile_checkout(store: Any, device: str) -> None:
    """Where a quantized checkout to the device spends its time: the chunks' host part (read,
    entropy-decoded) against the device part (uploaded, dequantized, waited for), summed over
    the I/O threads, against the wall time; to stderr."""
    import threading

    import ckptstore.checkout.reader as reader
    import ckptstore.device.decode as decode

    spent = {"host: read and decode codes": 0.0, "device: upload and dequantize": 0.0,
             "device: a chunk's stream waited for": 0.0}
    lock = threading.Lock()

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                with lock:
                    spent[name] += time.perf_counter() - t0
        return run

    real_codes, real_deq = reader.stored_codes, decode.dequantize_on_device
    real_sync = torch.cuda.Event.synchronize
    reader.stored_codes = lambda *a: timed("host: read and decode codes", real_codes(*a))
    decode.dequantize_on_device = timed("device: upload and dequantize", real_deq)
    torch.cuda.Event.synchronize = timed("device: a chunk's stream waited for", real_sync)
    try:
        store.checkout("main", map_location=device)  # warm
        for k in spent:
            spent[k] = 0.0
        t0 = time.perf_counter()
        store.checkout("main", map_location=device)
        _sync(device)
        wall = time.perf_counter() - t0
    finally:
        reader.stored_codes, decode.dequantize_on_device = real_codes, real_deq
        torch.cuda.Event.synchronize = real_sync
    print(f"# the 8-bit checkout to {device}: {1e3 * wall:.0f} ms wall; summed over its "
          "threads: " + ", ".join(f"{k} {1e3 * v:.0f} ms" for k, v in spent.items()),
          file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (the benchmark) or cpu (a smoke run)")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=1216)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--every", type=int, help="steps between checkpoints (default: "
                    "--every-seconds of steps)")
    ap.add_argument("--every-seconds", type=float, default=2.0)
    ap.add_argument("--checkpoints", type=int, default=4, help="checkpoints a timed run")
    ap.add_argument("--repeat", type=int, default=2, help="interleaved rounds")
    ap.add_argument("--only", nargs="*", help="configurations to run (default: all)")
    ap.add_argument("--first-commit", action="store_true",
                    help="also the first commit's stall against the next ones'")
    ap.add_argument("--no-restore", action="store_true", help="skip the restore table")
    ap.add_argument("--profile-restore", action="store_true",
                    help="profile the 8-bit checkout to the device (to stderr)")
    ap.add_argument("--root", help="folder the checkpoints go to (default: a temporary one)")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", module="torch.distributed.checkpoint")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("skipped: no CUDA device (use --device cpu for a smoke run)", file=sys.stderr)
        return 0
    print(f"# {command_line(__file__, argv)}\n# {machine_description()}")
    if args.device.startswith("cuda"):
        print(f"# device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    root = tempfile.mkdtemp(prefix="gpu-bench-", dir=args.root)
    try:
        tr = Trainer(args.layers, args.width, args.batch, args.seq, args.device)
        nbytes = sum(t.numel() * t.element_size() for t in tr.tensors())
        every, step = _every(tr, args.every_seconds)
        every = args.every or every
        steps = every * args.checkpoints
        print(f"# state: {human_bytes(nbytes)} ({len(tr.tensors())} tensors); a step "
              f"{1e3 * step:.1f} ms; a checkpoint every {every} steps "
              f"({every * step:.2f} s), {args.checkpoints} a run\n", flush=True)
        if args.first_commit:
            print(markdown_table(["snapshot in", "reservation", "first stall ms",
                                  "next stall ms", "first / next", "reserve took ms"],
                                 first_commit_rows(tr, root), "llrrrr"), flush=True)
            print()
        configs = _checkpointers(tr)
        if args.only is not None:
            configs = {k: v for k, v in configs.items() if k in args.only}
        if configs:
            print(markdown_table(*slowdown_table(tr, configs, steps, every, args.repeat, root)),
                  flush=True)
            print()
        if not args.no_restore:
            print(markdown_table(["restore of the weights", "ms", "vs torch.load"],
                                 restore_rows(tr, root, max(args.repeat, 3),
                                              args.profile_restore), "lrr"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def slowdown_table(tr: Trainer, configs: dict[str, Factory], steps: int, every: int,
                   repeat: int, root: str) -> tuple[list[str], list[list[str]], str]:
    """Each configuration's timed runs, interleaved round by round: the table's columns, rows
    and alignment."""
    runs: dict[str, list[tuple[float, list[float], tuple[int, int] | None, float]]] = {
        "none": []}
    runs |= {k: [] for k in configs}
    for r in range(repeat):
        order = ["none", *configs] if r % 2 == 0 else [*reversed(configs), "none"]
        for name in order:
            runs[name].append(timed_run(tr, steps, every, configs.get(name), root))
            print(f"round {r + 1}: {name}: {runs[name][-1][0]:.2f} s, stalls "
                  f"{[round(1e3 * x, 1) for x in runs[name][-1][1]]} ms, drain "
                  f"{runs[name][-1][3]:.2f} s", file=sys.stderr, flush=True)
    base = statistics.median(r[0] for r in runs["none"])
    bare = statistics.median(r[0] for r in runs["bare copy"]) - base \
        if "bare copy" in runs else None
    bare_stall = statistics.median(x for r in runs["bare copy"] for x in r[1]) \
        if "bare copy" in runs else None
    rows = []
    for name, rs in runs.items():
        seconds = statistics.median(r[0] for r in rs)
        stalls = [x for r in rs for x in r[1]]
        extra = seconds - base
        stall = statistics.median(stalls) if stalls else None
        rows.append([name, f"{seconds:.2f}", "–" if name == "none" else
                     f"{100 * extra / base:+.1f} %",
                     # a ratio of slowdowns only where the bare copy's is over the noise
                     "–" if bare is None or bare < 0.02 * base or name in ("none", "bare copy")
                     else f"{extra / bare:.2f}×",
                     "–" if bare is None or name in ("none", "bare copy") else
                     f"{seconds / (base + bare):.3f}×",
                     f"{1e3 * stall:.1f}" if stall is not None else "–",
                     f"{stall / bare_stall:.2f}×" if stall is not None and bare_stall and
                     name != "bare copy" else "–",
                     *([human_bytes(rs[-1][2][0]), human_bytes(rs[-1][2][1])] if rs[-1][2]
                       else ["–", "–"]),
                     "–" if name == "none" else f"{statistics.median(r[3] for r in rs):.2f}"])
    return (["configuration", "seconds", "slowdown", "slowdown / bare copy's",
             "time / bare copy's", "median stall ms", "stall / bare copy's", "host staging",
             "device staging", "drain s"], rows, "lrrrrrrrrr")


if __name__ == "__main__":
    raise SystemExit(main())
