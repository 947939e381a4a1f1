"""What a persist costs in a thread and in a persist process (``open(..., background="process")``):
the stall, the persist's wall time, and the CPU of both processes, side by side.

Usage::

    .venv/bin/python benchmarks/persist_process.py                  # ~2 minutes
    .venv/bin/python benchmarks/persist_process.py --state minilm --commits 4

What is measured
----------------
A child process opens a store each way, commits the state once to warm up (a persist process
starts then), then ``--commits`` times with ``commit_async`` and ``wait()``; per commit: the stall
(``pending.stall_seconds``: flatten and copy), the persist (``pending.persist_seconds``), the
CPU seconds of the committing process and of its persist process (``/proc/<pid>/stat``, user +
system), medians over the commits. The two ways alternate for ``--rounds`` rounds (medians over
the rounds). The state: ``--size`` MB of async_writer.py's synthetic floats, MiniLM's weights
and AdamW moments (``--state minilm``, cpu_proxy.py's), or a recommendation model (``--state
recsys``: a ``--size`` MB embedding table of 64 float32 columns with sparse gradients, Adagrad,
a row tracker; 4 training steps of 2048 lookups before each commit, about 0.5 % of the rows).
Policies: lossless, tracked increments (``incremental="intermittent"``), raw bits, 4-bit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import command_line, machine_description, markdown_table  # noqa: E402

CONFIGS = {
    "lossless (default)": "EncodingOptions(), Policy()",
    "tracked increments (intermittent)": "EncodingOptions(), Policy(incremental='intermittent')",
    "raw bits": "EncodingOptions(compression='none'), Policy()",
    "4-bit (the adaptive search)": "EncodingOptions(), Policy(quantize=QuantSpec(bits=4))",
}

CHILD = r"""
import json, os, statistics, sys, tempfile, time
sys.path.insert(0, {bench!r})
from ckptstore import EncodingOptions, Policy, QuantSpec
import ckptstore

def cpu(pid):
    with open(f"/proc/{{pid}}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

tracker = None
if {state!r} == "minilm":
    from cpu_proxy import minilm_state
    state = minilm_state()
elif {state!r} == "recsys":
    import torch
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({{"emb": torch.nn.Embedding({size} << 14, 64, sparse=True),
                                  "head": torch.nn.Linear(64, 1)}})
    opt = torch.optim.Adagrad(model.parameters(), lr=0.01)
    tracker = ckptstore.track(model, opt)
    state = {{"model": model, "opt": opt, "step": 0}}

    def train():
        for _ in range(4):  # 4 batches of 2048 lookups: about 0.5 % of the rows
            idx = torch.randint(0, {size} << 14, (2048,))
            loss = model["head"](model["emb"](idx)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    train()
else:
    from async_writer import build_state
    state = build_state({size} << 20)
options, policy = {config}
store = ckptstore.open(tempfile.mkdtemp(dir={root!r}), options=options, policy=policy,
                       background={background!r})
store.commit_async(state, tracker=tracker).wait()
worker = getattr(store.committer, "_worker", None)
rows = []
for i in range({commits}):
    state["step"] = i
    if tracker is not None:
        train()
    mine, theirs = cpu(os.getpid()), cpu(worker.proc.pid) if worker else 0.0
    pending = store.commit_async(state, tracker=tracker)
    pending.wait()
    rows.append((pending.stall_seconds, pending.persist_seconds, cpu(os.getpid()) - mine,
                 (cpu(worker.proc.pid) - theirs) if worker else 0.0))
store.close()
print(json.dumps([statistics.median(r[k] for r in rows) for k in range(4)]))
"""


def measure(config: str, background: str, args: argparse.Namespace) -> list[float]:
    code = CHILD.format(bench=os.path.dirname(os.path.abspath(__file__)), state=args.state,
                        size=args.size, config=f"({CONFIGS[config]})", root=args.root,
                        background=background, commits=args.commits)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--state", choices=["synthetic", "minilm", "recsys"], default="synthetic")
    ap.add_argument("--size", type=int, default=256,
                    help="MB of the synthetic state, or of the recsys table")
    ap.add_argument("--commits", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--root", default=os.environ.get("TMPDIR", "/tmp"))
    args = ap.parse_args(argv)
    print(f"# {command_line(__file__, argv)}\n# {machine_description()}\n")
    configs = [c for c in CONFIGS if not args.only or any(o in c for o in args.only)]
    runs: dict[tuple[str, str], list[list[float]]] = {}
    for _ in range(args.rounds):
        for config in configs:
            for background in ("thread", "process"):
                runs.setdefault((config, background), []).append(
                    measure(config, background, args))
    rows = []
    for (config, background), r in runs.items():
        med = [statistics.median(x[k] for x in r) for k in range(4)]
        rows.append([config, background, f"{1e3 * med[0]:.0f}", f"{1e3 * med[1]:.0f}",
                     f"{med[2]:.2f}", f"{med[3]:.2f}", f"{med[2] + med[3]:.2f}"])
    print(markdown_table(["configuration", "background", "stall ms", "persist ms",
                          "CPU-s a commit, committing process", "CPU-s, persist process",
                          "CPU-s in all"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
