"""Store I/O (lossless): ckptstore commit / checkout against torch.save / torch.load,
safetensors and torch.distributed.checkpoint on the same ~257 MB model state.

Usage::

    .venv/bin/python benchmarks/store_io.py                 # 3 repeats, markdown table on stdout
    .venv/bin/python benchmarks/store_io.py --repeat 5 --markdown-out /tmp/store_io.md
    .venv/bin/python benchmarks/store_io.py --scale 0.1 --repeat 1   # quick smoke run

What is measured
----------------
* The state: a seeded ``nn.Module`` with two embedding tables (600 000 x 64 and 150 000 x 128) and
  an MLP (Linear with biases, LayerNorm), 257.2 MB of float32 weights in 14 tensors. Model weights
  only, no optimizer state, so every tool saves exactly the same tensors.
* Each tool writes into its own fresh folder under ``--dir`` (default: a temporary folder under
  /tmp) and reads it back. Save and load are timed separately, ``--repeat`` times each (tools
  interleaved round by round), and the median is reported. ``os.sync()`` runs (untimed) before
  every timed operation so writeback of an earlier write does not slow it down. The page cache is
  not dropped (that needs root): loads read files that were just written, i.e. page-cache-warm.
* Every load is followed, inside the timed region, by a *touch*: the sum of every tensor. That
  forces lazily memory-mapped tensors (safetensors ``load_file``) to actually be read, and costs
  every tool the same; its cost on in-memory tensors is printed so it can be subtracted.
* torch.save: default zip format; torch.load with ``weights_only=True, map_location="cpu"``.
  safetensors: ``save_file`` / ``load_file``. torch.distributed.checkpoint: ``dcp.save`` /
  ``dcp.load`` single process without a process group, ``FileSystemWriter(sync_files=False)`` (no
  other tool fsyncs its data) and the default single writer thread; ``dcp.load`` fills tensors
  allocated (inside the timed region) with ``torch.empty_like``. ckptstore:
  ``open(dir).commit(model)`` and ``open(dir, create=False).checkout("main")``, store opening
  included, with the default encoding (blosc lz4 + bit-shuffle + crc32c) and with
  ``EncodingOptions(compression="none")`` (crc32c only) and ``compression="entropy"`` (byte
  planes, each Huffman, zstd or raw + crc32c).
* Every tool's first round is checked: the loaded tensors must equal the saved ones bit for bit.
"""

from __future__ import annotations

import argparse
import gc
import os
import shlex
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (dir_bytes, fmt_rate, fmt_ratio, human_bytes,  # noqa: E402
                    load_average, machine_description, markdown_table, time_call, write_text)

import ckptstore  # noqa: E402


# -- the state -----------------------------------------------------------------------------------
class RecModel(nn.Module):
    """Two embedding tables feeding an MLP: the shape of a small recommendation model."""

    def __init__(self, rows_a: int = 600_000, rows_b: int = 150_000, dim_a: int = 64,
                 dim_b: int = 128, hidden: int = 2048):
        super().__init__()
        self.emb_a = nn.Embedding(rows_a, dim_a)
        self.emb_b = nn.Embedding(rows_b, dim_b)
        self.mlp = nn.Sequential(
            nn.Linear(dim_a + dim_b, hidden), nn.LayerNorm(hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.LayerNorm(hidden), nn.ReLU(),
            nn.Linear(hidden, hidden // 2), nn.ReLU(),
            nn.Linear(hidden // 2, 1),
        )


def build_model(seed: int = 0, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The benchmark state, deterministic for a seed (default nn initialisation)."""
    torch.manual_seed(seed)
    model = RecModel(rows_a=max(1, int(600_000 * scale)), rows_b=max(1, int(150_000 * scale)))
    return model.to(dtype).eval()


def tensor_bytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def iter_tensors(obj: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """``(dotted path, tensor)`` for every tensor in a nested dict/list state."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from iter_tensors(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from iter_tensors(v, f"{prefix}.{i}" if prefix else str(i))


def touch(state: Any) -> float:
    """Read every element of every tensor (forces lazily mapped data in); returns the sum."""
    total = 0.0
    for _, t in iter_tensors(state):
        total += float(t.sum())
    return total


def check_equal(loaded: Any, expected: dict[str, torch.Tensor], tool: str) -> None:
    got = dict(iter_tensors(loaded))
    if set(got) != set(expected):
        raise SystemExit(f"{tool}: loaded keys {sorted(got)} differ from {sorted(expected)}")
    for k, t in expected.items():
        g = got[k]
        if g.dtype != t.dtype or g.shape != t.shape or not torch.equal(g.cpu(), t):
            raise SystemExit(f"{tool}: tensor {k!r} does not round-trip exactly")


# -- the tools -----------------------------------------------------------------------------------
@dataclass
class Tool:
    name: str
    save: Callable[[nn.Module, str], None]  # (model, empty folder)
    load: Callable[[str, dict[str, torch.Tensor]], Any]  # (folder, template state) -> state
    save_s: list[float] = field(default_factory=list)
    load_s: list[float] = field(default_factory=list)
    save_cpu: list[float] = field(default_factory=list)
    load_cpu: list[float] = field(default_factory=list)
    stored: int = 0

    @property
    def slug(self) -> str:
        return "".join(c if c.isalnum() else "_" for c in self.name)


def torch_tool() -> Tool:
    def save(model: nn.Module, d: str) -> None:
        torch.save(model.state_dict(), os.path.join(d, "model.pt"))

    def load(d: str, template: dict) -> Any:
        return torch.load(os.path.join(d, "model.pt"), map_location="cpu", weights_only=True)

    return Tool("torch.save / torch.load", save, load)


def safetensors_tool() -> Tool:
    from safetensors.torch import load_file, save_file

    def save(model: nn.Module, d: str) -> None:
        save_file(model.state_dict(), os.path.join(d, "model.safetensors"))

    def load(d: str, template: dict) -> Any:
        return load_file(os.path.join(d, "model.safetensors"), device="cpu")

    return Tool("safetensors", save, load)


def dcp_tool() -> Tool:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    def save(model: nn.Module, d: str) -> None:
        dcp.save(model.state_dict(), storage_writer=FileSystemWriter(d, sync_files=False))

    def load(d: str, template: dict) -> Any:
        out = {k: torch.empty_like(v) for k, v in template.items()}
        dcp.load(out, storage_reader=FileSystemReader(d))
        return out

    return Tool("torch.distributed.checkpoint", save, load)


def ckptstore_tool(compression: str, chunk_bytes: int | None) -> Tool:
    kw = {"chunk_bytes": chunk_bytes} if chunk_bytes else {}
    options = ckptstore.EncodingOptions(compression=compression, **kw)

    def save(model: nn.Module, d: str) -> None:
        with ckptstore.open(d, options=options) as store:
            store.commit(model)

    def load(d: str, template: dict) -> Any:
        with ckptstore.open(d, create=False) as store:
            return store.checkout("main")

    label = {"none": "no compression"}.get(compression, compression)
    return Tool(f"ckptstore ({label})", save, load)


TOOLS: dict[str, Callable[[argparse.Namespace], Tool]] = {
    "torch": lambda a: torch_tool(),
    "safetensors": lambda a: safetensors_tool(),
    "dcp": lambda a: dcp_tool(),
    "ckptstore": lambda a: ckptstore_tool("lz4", a.chunk_bytes),
    "ckptstore-raw": lambda a: ckptstore_tool("none", a.chunk_bytes),
    "ckptstore-entropy": lambda a: ckptstore_tool("entropy", a.chunk_bytes),
}


# -- the run -------------------------------------------------------------------------------------
def run_once(tool: Tool, model: nn.Module, template: dict[str, torch.Tensor], folder: str,
             check: bool, record: bool) -> None:
    if os.path.exists(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    save_t, _ = time_call(lambda: tool.save(model, folder))
    stored = dir_bytes(folder)

    def load_and_touch() -> Any:
        state = tool.load(folder, template)
        touch(state)
        return state

    load_t, loaded = time_call(load_and_touch)
    if check:
        check_equal(loaded, template, tool.name)
    del loaded
    gc.collect()
    shutil.rmtree(folder)
    if record:
        tool.save_s.append(save_t.seconds)
        tool.load_s.append(load_t.seconds)
        tool.save_cpu.append(save_t.cpu_seconds)
        tool.load_cpu.append(load_t.cpu_seconds)
        tool.stored = stored


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def report(tools: list[Tool], logical: int, ntensors: int, args: argparse.Namespace,
           touch_s: float, loads: tuple[str, str]) -> str:
    by = {t.name: t for t in tools}
    ref_save = by.get("safetensors")
    ref_load = by.get("torch.save / torch.load")
    rows = []
    for t in tools:
        s, lo = median(t.save_s), median(t.load_s)
        save_ratio = median(ref_save.save_s) / s if ref_save else None
        load_ratio = median(ref_load.load_s) / lo if ref_load else None
        bytes_ratio = t.stored / ref_load.stored if ref_load else None
        rows.append([t.name, f"{s:.3f} ({median(t.save_cpu):.3f})", fmt_rate(logical, s),
                     fmt_ratio(save_ratio), f"{lo:.3f} ({median(t.load_cpu):.3f})",
                     fmt_rate(logical, lo), fmt_ratio(load_ratio),
                     f"{t.stored:,}", fmt_ratio(bytes_ratio, 4)])
    table = markdown_table(
        ["tool", "save s (CPU s)", "save MB/s", "save vs safetensors", "load s (CPU s)",
         "load MB/s", "load vs torch.load", "stored bytes", "stored vs torch.save"], rows)
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", "benchmarks/store_io.py",
                                                *sys.argv[1:]])
    notes = [
        f"State: {human_bytes(logical)} ({logical} bytes) of {args.dtype} model weights in "
        f"{ntensors} tensors (seed {args.seed}, scale {args.scale}). Median of {args.repeat} "
        f"round(s); MB = 10^6 bytes; ratios > 1 are faster (smaller for stored bytes ≤ 1).",
        f"Machine: {machine_description()}; folder {args.dir or tempfile.gettempdir()}, "
        f"page-cache warm; `os.sync()` before each timed operation; 1-min load average "
        f"{loads[0]} at start, {loads[1]} at end (other processes share the cores when > 0).",
        "Times are wall seconds (medians); in brackets the CPU seconds of the process (all "
        "threads) for the same operation.",
        f"Load includes summing every tensor (touch); the touch alone on in-memory tensors takes "
        f"{touch_s:.3f} s.",
        f"Command: `{command}`",
    ]
    return table + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=3,
                   help="timed rounds per tool (median; default 3)")
    p.add_argument("--dir", default=None,
                   help="folder for the files written (default: a fresh temporary folder)")
    p.add_argument("--markdown-out", default=None, help="also write the markdown report here")
    p.add_argument("--tools", default=",".join(TOOLS),
                   help=f"comma-separated subset of {','.join(TOOLS)} (default: all)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="dtype of the model weights (default float32)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply the embedding rows (0.1 for a quick run; default 1.0)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model initialisation")
    p.add_argument("--chunk-bytes", type=int, default=None,
                   help="ckptstore EncodingOptions(chunk_bytes=...) (default: the library's)")
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the untimed warm-up round on a tiny model")
    args = p.parse_args(argv)
    unknown = set(args.tools.split(",")) - set(TOOLS)
    if unknown:
        p.error(f"unknown tools {sorted(unknown)}; choose from {sorted(TOOLS)}")
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    tools = [TOOLS[name](args) for name in args.tools.split(",")]
    base = args.dir or tempfile.mkdtemp(prefix="store_io-")
    os.makedirs(base, exist_ok=True)
    try:
        if not args.no_warmup:  # first-call costs (lazy imports, thread pools) stay untimed
            tiny = build_model(args.seed, scale=0.001, dtype=dtype)
            tiny_sd = dict(tiny.state_dict())
            for t in tools:
                run_once(t, tiny, tiny_sd, os.path.join(base, f"warmup-{t.slug}"), True, False)
        load_start = load_average()
        model = build_model(args.seed, args.scale, dtype)
        template = dict(model.state_dict())
        logical = tensor_bytes(template)
        touch_s = min(time_call(lambda: touch(template), sync=False)[0].seconds
                      for _ in range(3))
        print(f"state: {human_bytes(logical)} in {len(template)} tensors; folder {base}",
              file=sys.stderr)
        for r in range(args.repeat):
            for t in tools:
                run_once(t, model, template, os.path.join(base, f"{t.slug}-{r}"), r == 0, True)
                print(f"round {r + 1}/{args.repeat} {t.name}: save {t.save_s[-1]:.3f} s, "
                      f"load {t.load_s[-1]:.3f} s, {human_bytes(t.stored)}", file=sys.stderr)
        text = report(tools, logical, len(template), args, touch_s, (load_start, load_average()))
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    print(text)
    if args.markdown_out:
        write_text(args.markdown_out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
