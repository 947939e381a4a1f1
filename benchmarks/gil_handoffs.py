"""How many times a background persist takes the GIL back (issue 28): the count that decides
how long a persist takes beside a training loop that keeps the GIL busy.

Usage (Linux, root, ``perf`` installed)::

    .venv/bin/python benchmarks/gil_handoffs.py                  # ~1 minute
    .venv/bin/python benchmarks/gil_handoffs.py --size 64 --commits 3

What is measured
----------------
Every time a thread comes back from a call that released the GIL (an ``os`` call, a compiled
kernel, a blocking lock, a tensor's dealloc) it takes the GIL back in ``PyEval_RestoreThread``;
beside a thread that keeps the GIL busy, each such take-back waits for that thread's switch
interval (5 ms). A child process commits ``--size`` MB (async_writer.py's synthetic state) with
``commit_async`` once to warm up, ``--commits`` times timed, then ``--commits`` more times
while ``perf stat`` counts the calls of ``PyEval_RestoreThread`` (a uprobe) made by the store's background threads only (the
persist thread and its I/O pool), per commit; with the persist's wall time with the process
otherwise idle, and the CPU time the process spent per commit (user + system, the snapshot copy
included: what the commit takes out of the cores). The probe is added with ``perf probe`` on
the interpreter's library (root).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import command_line, machine_description, markdown_table  # noqa: E402

CONFIGS = {
    "lossless (default)": "EncodingOptions()",
    "raw bits": "EncodingOptions(compression='none')",
    "8-bit": "EncodingOptions(), policy=Policy(quantize=QuantSpec(bits=8))",
    "8-bit, every chunk entropy coded":
        "EncodingOptions(), policy=Policy(quantize=QuantSpec(bits=8, entropy_min_saving=0.0))",
    "8-bit adaptive search":
        "EncodingOptions(), policy=Policy(quantize=QuantSpec('adaptive-asymmetric', bits=8))",
    "8-bit, a kernel call a step (before)":
        "EncodingOptions(), policy=Policy(quantize=QuantSpec(bits=8))",
    "8-bit adaptive search, a kernel call a step (before)":
        "EncodingOptions(), policy=Policy(quantize=QuantSpec('adaptive-asymmetric', bits=8))",
    "8-bit adaptive search, steps and the whole walk (before)":
        "EncodingOptions(), policy=Policy(quantize=QuantSpec('adaptive-asymmetric', bits=8))",
    "4-bit (QuantSpec(bits=4): the adaptive search)":
        "EncodingOptions(), policy=Policy(quantize=QuantSpec(bits=4))",
    "4-bit, a kernel call a step (before)":
        "EncodingOptions(), policy=Policy(quantize=QuantSpec(bits=4))",
    "lossless, planes coded below 0.985 (before)": "EncodingOptions()",
    "lossless, every kernel call releases the GIL (before)": "EncodingOptions()",
    "8-bit, every kernel call releases the GIL (before)":
        "EncodingOptions(), policy=Policy(quantize=QuantSpec(bits=8))",
}
#: what runs in the child before the store opens, for a configuration that needs it: before the
#: one-call chunk encoder (issue 28), quantized chunks were encoded a kernel call a step
_STEPS = ("from ckptcodecs import Quantize, rle_huffman\n"
          "Quantize.encode_one_call = lambda self, buf, **kw: None\n"
          "rle_huffman._ONE_CALL = None")
#: before the adaptive search's early end (issue 28): every greedy walk to its end
_WHOLE_WALK = "from ckptcodecs import _backend\n_backend.native().adaptive_early_end(False)"
#: before kernels on less than 128 KiB kept the GIL (issue 28): every call released it
_EVERY_CALL = "from ckptcodecs import _backend\n_backend.native().nogil_min(0)"
PRELUDES = {
    "8-bit, a kernel call a step (before)": _STEPS,
    "8-bit adaptive search, a kernel call a step (before)": _STEPS,
    "8-bit adaptive search, steps and the whole walk (before)": _STEPS + "\n" + _WHOLE_WALK,
    "4-bit, a kernel call a step (before)": _STEPS,
    # before planes that save under 2 % stayed raw (issue 28)
    "lossless, planes coded below 0.985 (before)":
        "from ckptcodecs import planes\nplanes.HUFFMAN_BELOW = 0.985",
    # before short kernels kept the GIL (issue 28)
    "lossless, every kernel call releases the GIL (before)": _EVERY_CALL,
    "8-bit, every kernel call releases the GIL (before)": _EVERY_CALL,
}
EVENT = "probe_libpython3:PyEval_RestoreThread"

CHILD = r"""
import os, resource, shutil, sys, tempfile, threading, time
sys.path.insert(0, {bench!r})
from async_writer import build_state
import ckptstore
from ckptstore import EncodingOptions, Policy, QuantSpec
if {minilm}:
    from cpu_proxy import minilm_state
    state = minilm_state()
else:
    state = build_state({size} << 20)
{prelude}
folder = tempfile.mkdtemp()
store = ckptstore.open(folder, options={config}, background='thread')  # the persist thread
store.commit_async(state).wait()
walls, cpus = [], []
for _ in range({commits}):  # before perf arms the probe: its traps cost CPU too
    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    store.commit_async(state).wait()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    walls.append(time.perf_counter() - t0)
    cpus.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
tids = [t.native_id for t in threading.enumerate() if t.name.startswith("ckptstore-")]
print(",".join(map(str, tids)), flush=True)
sys.stdin.readline()  # perf is attached
for _ in range({commits}):
    store.commit_async(state).wait()
print(sorted(walls)[len(walls) // 2], sorted(cpus)[len(cpus) // 2], flush=True)
sys.stdin.readline()  # perf has stopped counting
store.close()
shutil.rmtree(folder, ignore_errors=True)  # 2 GB and more a configuration
"""


def libpython() -> str:
    """The interpreter's shared library (where ``PyEval_RestoreThread`` lives)."""
    name = sysconfig.get_config_var("INSTSONAME") or ""
    path = os.path.join(sysconfig.get_config_var("LIBDIR") or "", name)
    return path if name and os.path.exists(path) else os.path.realpath(sys.executable)


def ensure_probe() -> None:
    listed = subprocess.run(["perf", "probe", "-l"], capture_output=True, text=True).stdout
    if "PyEval_RestoreThread" not in listed:
        subprocess.run(["perf", "probe", "-q", "-x", libpython(), "PyEval_RestoreThread"],
                       check=True)


def measure(config: str, size: int, commits: int, prelude: str = "", minilm: bool = False
            ) -> tuple[float, float, float]:
    """(GIL take-backs of the background threads per commit, median persist seconds, median
    CPU seconds of the process per commit)."""
    code = CHILD.format(bench=os.path.dirname(os.path.abspath(__file__)), size=size,
                        config=config, commits=commits, prelude=prelude, minilm=minilm)
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    tids = child.stdout.readline().strip()
    with tempfile.NamedTemporaryFile("r", suffix=".txt") as out:
        perf = subprocess.Popen(["perf", "stat", "-x", ",", "-e", EVENT, "-t", tids, "-o",
                                 out.name], stderr=subprocess.DEVNULL)
        threading.Event().wait(1.0)  # perf attaches
        child.stdin.write("\n")
        child.stdin.flush()
        wall, cpu = map(float, child.stdout.readline().split())
        perf.send_signal(2)
        perf.wait()
        child.stdin.write("\n")
        child.stdin.flush()
        child.wait()
        counts = [int(m.group(1)) for m in re.finditer(r"^(\d+),", out.read(), re.M)]
    return sum(counts) / commits, wall, cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=256, help="state size in MB")
    ap.add_argument("--commits", type=int, default=4, help="commits counted, after a warm one")
    ap.add_argument("--state", choices=["synthetic", "minilm"], default="synthetic",
                    help="minilm: cpu_proxy.py's real state (MiniLM's weights and AdamW moments, "
                         "271 MB in 310 tensors; --size ignored)")
    ap.add_argument("--only", nargs="*", help="configurations whose names contain one of these")
    args = ap.parse_args(argv)
    if os.geteuid() != 0 or subprocess.run(["which", "perf"], capture_output=True).returncode:
        print("needs root and perf (a uprobe on PyEval_RestoreThread)", file=sys.stderr)
        return 1
    ensure_probe()
    print(f"# {command_line(__file__, argv)}\n# {machine_description()}\n")
    rows = []
    for name, config in CONFIGS.items():
        if args.only and not any(o in name for o in args.only):
            continue
        per_commit, wall, cpu = measure(config, args.size, args.commits,
                                        PRELUDES.get(name, ""), args.state == "minilm")
        rows.append([name, f"{per_commit:.0f}", f"{1e3 * wall:.0f}", f"{cpu:.2f}"])
    print(markdown_table(["configuration", "GIL take-backs a commit (background threads)",
                          "persist ms (idle process)", "CPU-s a commit"], rows, "lrrr"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
