"""Quantization on the tensor's device (issue 11, :mod:`ckptstore.device.quant`): the torch path
computes the codes and parameters of the host path bit for bit, so a commit quantized on a GPU
and one quantized on the CPU store the same chunks. CI has no GPU: ``device_encode="always"``
runs the very same code on CPU tensors, and every test compares it with the host path."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import ckptstore
from helpers import chunk_files
from ckptcodecs import quantize
from ckptstore import EncodingOptions, Policy, QuantSpec
from ckptstore.commit.placement import device_items
from ckptstore.device.quant import device_quantizable, quantize_on_device
from ckptstore.commit.plan import plan_commit
from ckptstore.state.tree import flatten

UNIFORM = ("uniform-asymmetric", "uniform-symmetric")


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.view(torch.uint16).numpy() if t.dtype == torch.bfloat16 else t.numpy()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_codes_and_parameters_equal_the_host_path(dtype):
    rng = np.random.default_rng(0)
    for method, bits, gran, shape, scale in itertools.product(
            UNIFORM, [1, 2, 3, 4, 8], ["row", "tensor", "group"], [(64, 33), (1000,), (7, 5, 64)],
            [1.0, 1e-30, 1e30, 1e-37, 0.0]):
        if dtype == torch.float16 and scale not in (1.0, 0.0):
            continue
        x = torch.from_numpy(rng.standard_normal(shape) * scale).to(dtype)
        kw = {"method": method, "bits": bits, "granularity": gran}
        if gran == "group":
            kw["group_size"] = 48
        if dtype == torch.bfloat16:
            kw["dtype"] = "bfloat16"
        want_codes, want = quantize(_bits(x), **kw)
        codes, got = quantize_on_device(x, kw)
        case = (method, bits, gran, shape, scale)
        np.testing.assert_array_equal(codes.numpy(), want_codes, err_msg=str(case))
        for name in ("zero", "scale"):
            a, b = getattr(got, name), getattr(want, name)
            assert a.dtype == b.dtype and np.array_equal(a, b), case
        assert (got.nq, got.seg_len, got.count, got.dtype) == (want.nq, want.seg_len,
                                                                 want.count, want.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_adaptive_ranges_equal_the_host_search(dtype):
    """Check-N-Run's greedy search: histograms counted on the device, searched by the host's
    kernel, give the host path's ranges and codes; segments the host searches value by value
    are left to it."""
    rng = np.random.default_rng(1)
    on_device = 0
    for bits, gran, shape, ratio, bins in itertools.product(
            [2, 3, 4, 8], ["row", "tensor", "group"], [(64, 64), (3000,), (9, 5, 700)],
            [1.0, 0.6], [None, 10]):
        x = torch.from_numpy(rng.standard_normal(shape) ** 3).to(dtype)
        kw = {"method": "adaptive-asymmetric", "bits": bits, "granularity": gran,
              "ratio": ratio, "group_size": 1000 if gran == "group" else None}
        if bins:
            kw["num_bins"] = bins
        if dtype == torch.bfloat16:
            kw["dtype"] = "bfloat16"
        got = quantize_on_device(x, kw)
        assert (got is None) is (not device_quantizable(kw, shape))
        if got is None:
            continue
        on_device += 1
        want_codes, want = quantize(_bits(x), **kw)
        np.testing.assert_array_equal(got[0].numpy(), want_codes)
        assert np.array_equal(got[1].zero, want.zero) and np.array_equal(got[1].scale,
                                                                         want.scale)
    assert on_device >= 100


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_values_on_the_search_grid_fall_in_the_host_cells(dtype):
    """Rows whose values sit on the edges of the search's histogram cells: the device computes
    the cell width as the host's search does (a correctly rounded division of the cell count by
    the range; a product with the range's reciprocal moves about a quarter of such rows' values
    across an edge)."""
    from ckptcodecs.adaptive import HIST_PER_BIN, default_num_bins

    cells = default_num_bins(4) * HIST_PER_BIN
    rng = np.random.default_rng(7)
    rows = np.stack([rng.uniform(-5, 0) + np.arange(cells + 1) * (rng.uniform(0.1, 10) / cells)
                     for _ in range(256)])
    x = torch.from_numpy(rows).to(dtype)
    kw = {"method": "adaptive-asymmetric", "bits": 4, "granularity": "row"}
    assert device_quantizable(kw, tuple(x.shape))
    codes, got = quantize_on_device(x, kw)
    want_codes, want = quantize(x.numpy(), **kw)
    np.testing.assert_array_equal(codes.numpy(), want_codes)
    assert np.array_equal(got.zero, want.zero) and np.array_equal(got.scale, want.scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_kmeans_levels_and_codes_equal_the_host_fit(dtype, monkeypatch):
    """DynaQuant's k-means: buckets (counts, exact float64 sums) made on the device, fitted by
    the host's kernel, nearest levels found on the device: the host path's codebook and codes."""
    import ckptstore.device.quant as devquant_module

    monkeypatch.setattr(devquant_module, "KMEANS_MIN_SEGMENT", 1)  # short segments too
    rng = np.random.default_rng(2)
    for bits, gran, levels, lam, shape in itertools.product(
            [1, 2, 4, 8], ["tensor", "row", "group"], [None, 5], [1.0, 0.3],
            [(300, 64), (5000,), (7, 9, 33)]):
        if levels and levels > 1 << bits:
            continue
        x = torch.from_numpy(rng.standard_normal(shape) ** 3).clamp(-6e4, 6e4).to(dtype)
        kw = {"method": "kmeans", "bits": bits, "granularity": gran, "lam": lam,
              "group_size": 100 if gran == "group" else None}
        if levels:
            kw["levels"] = levels
        if dtype == torch.bfloat16:
            kw["dtype"] = "bfloat16"
        codes, got = quantize_on_device(x, kw)
        want_codes, want = quantize(_bits(x), **kw)
        case = (bits, gran, levels, lam, shape)
        np.testing.assert_array_equal(codes.numpy(), want_codes, err_msg=str(case))
        assert got.codebook.dtype == want.codebook.dtype, case
        assert np.array_equal(got.codebook, want.codebook), case


def test_kmeans_float64_and_short_segments_stay_on_the_host():
    kw = {"method": "kmeans", "bits": 4, "granularity": "tensor"}
    assert device_quantizable(kw, (1 << 16,)) and not device_quantizable(kw, (4096,))
    assert quantize_on_device(torch.randn(1 << 16, dtype=torch.float64), kw) is None


@pytest.mark.parametrize("method", ["uniform-asymmetric", "uniform-symmetric",
                                    "adaptive-asymmetric", "kmeans"])
def test_protect_prune_and_half_parameters_equal_the_host_path(method, monkeypatch):
    """Protected (largest magnitudes, kept in bfloat16) and pruned (smallest) values chosen on
    the device, ties to the lowest indices as on the host -- many exact zeros included -- and
    left out of every range, histogram and fit; float16 parameters rounded by the host's kernel
    (float32 kept where they overflow float16): the host path's codes and parameters."""
    import ckptstore.device.quant as devquant_module

    monkeypatch.setattr(devquant_module, "KMEANS_MIN_SEGMENT", 1)
    rng = np.random.default_rng(3)
    checked = 0
    for dtype, bits, extra, gran, ties in itertools.product(
            [torch.float32, torch.bfloat16], [2, 4, 8],
            [{"protect": 0.01}, {"prune": 0.3}, {"protect": 0.02, "prune": 0.2},
             {"protect": 0.05, "protect_mode": "sparse"},
             {"protect": 0.01, "prune": 0.1, "protect_mode": "sparse"},
             {"param_dtype": "float16"}, {"param_dtype": "float16", "scale": 1e6}],
            ["row", "tensor"], [False, True]):
        extra = dict(extra)
        x = torch.from_numpy(rng.standard_normal((60, 100)) * extra.pop("scale", 2)).to(dtype)
        if ties:
            x[:, ::3] = 0
            x[5] = 1.0  # a constant row: every value ties
        kw = {"method": method, "bits": bits, "granularity": gran, **extra}
        if dtype == torch.bfloat16:
            kw["dtype"] = "bfloat16"
        got = quantize_on_device(x, kw)
        try:
            want_codes, want = quantize(_bits(x), **kw)
        except ValueError:  # no level left next to the special ones: the host says why
            assert got is None
            continue
        if got is None:  # adaptive rows the host searches value by value
            assert method == "adaptive-asymmetric" and gran == "row"
            continue
        codes, params = got
        case = (dtype, bits, extra, gran, ties)
        np.testing.assert_array_equal(codes.numpy(), want_codes, err_msg=str(case))
        for name in ("zero", "scale", "codebook", "protected", "protect_positions"):
            assert np.array_equal(getattr(params, name), getattr(want, name)), (name, case)
        assert (params.nq, params.has_prune, params.has_protect, params.param_dtype) == (
            want.nq, want.has_prune, want.has_protect, want.param_dtype), case
        checked += 1
    assert checked >= 110


def test_a_chunk_with_non_finite_values_is_left_to_the_host():
    x = torch.randn(10, 10)
    x[3, 3] = float("nan")
    assert quantize_on_device(x, {"method": "uniform-asymmetric", "bits": 4}) is None


@pytest.mark.parametrize("kw, ok", [
    ({"method": "uniform-asymmetric", "bits": 4}, True),
    ({"method": "uniform-symmetric", "bits": 8, "granularity": "tensor"}, True),
    ({"method": "adaptive-asymmetric", "bits": 4}, True),
    ({"method": "kmeans", "bits": 4}, True),
    ({"method": "uniform-asymmetric", "bits": 4, "protect": 0.01}, True),
    ({"method": "kmeans", "bits": 4, "prune": 0.1, "protect_mode": "sparse"}, True),
    ({"method": "uniform-asymmetric", "bits": 4, "param_dtype": "float16"}, True),
    ({"method": "no-such-method", "bits": 4}, False),
])
def test_which_encodings_the_device_reproduces(kw, ok):
    assert device_quantizable(kw) is ok


def test_adaptive_rows_searched_value_by_value_stay_on_the_host():
    kw = {"method": "adaptive-asymmetric", "bits": 4}  # rows of up to 46 values: direct
    assert device_quantizable(kw, (100, 64)) and not device_quantizable(kw, (100, 46))
    assert not device_quantizable({**kw, "bits": 8}, (100, 384))


def _state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(1000, 96, generator=g)
    w[5, 7] = float("inf")  # this chunk takes the host path
    return {"w": w, "b": torch.randn(300, 257, generator=g).to(torch.bfloat16),
            "t": torch.randn(512, 64, generator=g).t(),     # strided: C order of the shape
            "h": torch.randn(4096, generator=g).half(),
            "small": torch.randn(10, generator=g), "step": 3}


SPECS = [QuantSpec("uniform-asymmetric", 4), QuantSpec("uniform-symmetric", 8, "tensor"),
         QuantSpec("uniform-asymmetric", 3, "group", group_size=100, entropy=False),
         QuantSpec(bits=4),  # "auto" (adaptive): "small" (10 values a row) searched on the host
         QuantSpec("kmeans", 4, "tensor", levels=12, lam=0.5),  # "small" fitted on the host
         QuantSpec("uniform-asymmetric", 4, protect=0.01, prune=0.2)]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.resolved_method}-{s.bits}-{s.granularity}")
@pytest.mark.parametrize("asynchronous, delta", [(False, True), (True, True), (True, False)],
                         ids=["commit-deltas", "commit_async-deltas", "commit_async-full"])
def test_device_encoded_commits_store_the_host_paths_chunks(tmp_path, monkeypatch, spec,
                                                           asynchronous, delta):
    """Full commits send packed codes from the device; code-delta chains keep their codes."""
    import ckptstore.commit.persist as writer_module

    import ckptstore.device.quant as devquant_module

    monkeypatch.setattr(devquant_module, "KMEANS_MIN_SEGMENT", 1024)  # the test's small chunks
    calls, packs = [], []
    real, real_pack = writer_module.device_chunk_codes, devquant_module.pack_on_device
    monkeypatch.setattr(writer_module, "device_chunk_codes",
                        lambda t, *a: calls.append(t.dtype) or real(t, *a))
    monkeypatch.setattr(devquant_module, "pack_on_device",
                        lambda *a: packs.append(1) or real_pack(*a))
    stored = {}
    for mode in ("off", "always"):
        store = ckptstore.open(tmp_path / mode, options=EncodingOptions(
            device_encode=mode, chunk_bytes=64 << 10))
        policy = Policy(quantize=spec, delta=delta, max_chain=3, min_quant_bytes=1)
        for seed in range(3):  # a full commit, then two code-delta links (or two full commits)
            state = _state(seed)
            if asynchronous:
                store.commit_async(state, policy=policy).wait()
            else:
                store.commit(state, policy=policy)
        assert store.verify().ok
        stored[mode] = (chunk_files(store, tmp_path / mode), store.checkout("main"))
    # every quantized tensor of the three commits went through the device path
    dtypes = [torch.float32, torch.bfloat16, torch.float32, torch.float16]
    if spec.resolved_method not in ("adaptive-asymmetric", "kmeans"):
        dtypes.append(torch.float32)  # "small"
    assert sorted(map(str, calls)) == sorted(map(str, 3 * dtypes))
    assert bool(packs) is not delta  # full arrays cross packed; delta chains keep their codes
    (chunks_off, out_off), (chunks_dev, out_dev) = stored["off"], stored["always"]
    assert chunks_dev.keys() == chunks_off.keys()
    assert any(".codes" in k for k in chunks_dev) is delta  # code deltas were written
    for k in chunks_off:
        assert chunks_dev[k] == chunks_off[k], k
    for k, v in out_off.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(out_dev[k], v), k


def test_which_items_go_to_the_device():
    state = {"w": torch.randn(512, 64), "emb": torch.randn(4096, 16), "i": torch.arange(20000)}
    _, leaves = flatten(state)
    for spec, mode, want in [
            (QuantSpec("uniform-asymmetric", 4), "always", {"w", "emb"}),
            (QuantSpec("uniform-asymmetric", 4), "auto", set()),       # CPU tensors: the host
            (QuantSpec("uniform-asymmetric", 4), "off", set()),
            (QuantSpec(bits=4), "always", {"w"}),       # adaptive: rows of 16 on the host
            (QuantSpec("adaptive-asymmetric", 8), "always", set()),  # rows of 64: the host
            (QuantSpec(bits=8), "always", {"w", "emb"})]:  # "auto" at 8 bits: uniform
        from ckptstore.chains.memory import ChainMemory

        decide = ChainMemory().decider(Policy(quantize=spec, min_quant_bytes=1), "main", None,
                                       None)
        plan = plan_commit(leaves, EncodingOptions(), decide)
        got = {plan.items[i].path for i in device_items(plan, mode, dedup=False)}
        assert got == want, (spec, mode)


def test_device_encode_option_is_checked():
    with pytest.raises(ValueError, match="device_encode"):
        EncodingOptions(device_encode="gpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CI has none)")
def test_cuda_commit_equals_the_cpu_commit(tmp_path):
    """Quantized on the GPU, lossless arrays and packed small tensors staged device-to-device
    and moved to the host by the persist thread: the chunks of a CPU commit."""
    cpu = {**_state(), "ints": torch.arange(100), "big_ints": torch.arange(100_000)}
    state = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in cpu.items()}
    policy = Policy(quantize=QuantSpec("uniform-asymmetric", 4), min_quant_bytes=1)
    chunks = []
    for name, mode, s in (("gpu", "auto", state), ("cpu", "off", cpu)):
        store = ckptstore.open(tmp_path / name, options=EncodingOptions(device_encode=mode))
        store.commit_async(s, policy=policy).wait()
        chunks.append(chunk_files(store, tmp_path / name))
        store.close()
    assert chunks[0] == chunks[1]


@pytest.mark.parametrize("bits", range(1, 9))
def test_bit_packing_on_the_device_is_ckptcodecs_layout(bits):
    from ckptcodecs import pack_bits

    from ckptstore.device.bits import pack_on_device, unpack_on_device

    rng = np.random.default_rng(bits)
    for n in (0, 1, 7, 8, 9, 1001):
        codes = rng.integers(0, 1 << bits, n).astype(np.uint8)
        packed = pack_on_device(torch.from_numpy(codes), bits)
        np.testing.assert_array_equal(packed.numpy(), pack_bits(codes, bits))
        np.testing.assert_array_equal(unpack_on_device(packed, bits, n).numpy(), codes)


def test_device_staging_buffers_are_reused_across_commits(tmp_path):
    """commit_async stages every tensor on its device ("always": CPU tensors too), and the
    persist thread moves the lossless ones to host buffers: both kinds of buffer are allocated
    once and reused, and the commits store what the host path stores."""
    state = {"a": torch.randn(1000, 100), "q": torch.randn(500, 64), "bias": torch.randn(10)}
    policy = Policy(overrides=(("q", QuantSpec("uniform-asymmetric", 4)),), min_quant_bytes=1)
    kept = []
    for mode in ("always", "off"):
        store = ckptstore.open(tmp_path / mode, options=EncodingOptions(device_encode=mode),
                               background="thread")  # the persist thread's buffers
        for _ in range(3):
            store.commit_async(state, policy=policy).wait()
            kept.append({k: id(b) for k, b in store._committer.staging._buffers.items()})
        out = store.checkout("main")
        assert torch.equal(out["a"], state["a"]) and torch.equal(out["bias"], state["bias"])
        assert chunk_files(store, tmp_path / mode).keys()
    assert kept[0] == kept[1] == kept[2]  # "always": no buffer made twice
    assert {k[0] for k in kept[0]} == {"cpu", "device", "packed"}
    # "q" is quantized where it was staged: it holds no host buffer
    assert {k[1] for k in kept[0] if k[0] == "cpu"} == {"a"}
    assert {k[0] for k in kept[3]} == {"cpu", "packed"}  # "off": host staging only
    stores = [ckptstore.open(tmp_path / m) for m in ("always", "off")]
    chunks = [chunk_files(s, tmp_path / m) for s, m in zip(stores, ("always", "off"))]
    assert chunks[0] == chunks[1]


def test_reserve_allocates_the_device_buffers_the_first_commit_uses(tmp_path):
    state = {"a": torch.randn(1000, 100), "b": torch.randn(300, 64)}
    store = ckptstore.open(tmp_path / "s", options=EncodingOptions(device_encode="always"))
    assert store.reserve(state).result() == 2 * sum(t.numel() * 4 for t in state.values())
    before = {k: id(b) for k, b in store._committer.staging._buffers.items()}
    assert {k[0] for k in before} == {"cpu", "device"}
    store.commit_async(state).wait()
    after = {k: id(b) for k, b in store._committer.staging._buffers.items()}
    assert after == before  # nothing allocated by the commit, nothing dropped
