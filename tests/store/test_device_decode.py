"""Checkout straight to the device (issue 11, :mod:`ckptstore.device.decode`): quantized chunks
upload their codes and are dequantized on the device, to the very values the host path makes.
CI has no GPU: the same code runs on CPU tensors, and every test compares it with the host path
bit for bit."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import ckptstore
import ckptstore.checkout.reader as reader_module
from ckptcodecs import dequantize, quantize
from ckptstore import Policy, QuantSpec
from ckptstore.format.arrays import tensor_to_host
from ckptstore.device.decode import dequantize_on_device, wants_device_decode
from ckptstore.errors import CorruptedChunkError


def _bits(t: torch.Tensor) -> np.ndarray:
    t = t.contiguous()
    return (t.view(torch.uint16) if t.dtype == torch.bfloat16 else t).numpy()


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # 1e300 protected in bf16
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_values_equal_the_host_dequantization(dtype):
    rng = np.random.default_rng(0)
    checked = 0
    for method, bits, extra, specials in itertools.product(
            ["uniform-asymmetric", "uniform-symmetric", "adaptive-asymmetric", "kmeans"],
            [2, 4, 8],
            [{}, {"protect": 0.01}, {"prune": 0.2}, {"granularity": "tensor"},
             {"protect": 0.02, "prune": 0.1, "protect_mode": "sparse"},
             {"param_dtype": "float16"}],
            [False, True]):
        x = torch.from_numpy(rng.standard_normal((50, 40)) * 3).to(dtype)
        if specials:  # non-finite values are protected; without them 8 bits have 256 levels
            x[1, 1], x[2, 2], x[3, 3] = float("nan"), float("inf"), -float("inf")
        if specials and dtype != torch.float16:
            x[4, 4] = 1e300 if dtype == torch.float64 else 3.3e38  # near the top of the range
        kw = {"method": method, "bits": bits, **extra}
        if dtype == torch.bfloat16:
            kw["dtype"] = "bfloat16"
        try:
            codes, params = quantize(tensor_to_host(x), **kw)
        except ValueError:  # no level left next to the special ones at 2 bits
            continue
        got = dequantize_on_device(codes, params, "cpu")
        assert got.dtype == dtype
        want = dequantize(codes, params)
        assert np.array_equal(_bits(got).view(np.uint8), np.ascontiguousarray(want).view(
            np.uint8)), (method, bits, extra)
        checked += 1
    assert checked >= 120


def test_packed_codes_are_checked_on_the_device():
    from ckptcodecs import pack_bits

    from ckptstore.device.bits import PackedCodes

    codes, params = quantize(np.linspace(-1, 1, 64, dtype=np.float32), "kmeans", 3, levels=5)
    packed = PackedCodes(pack_bits(codes, 3), 64, 3)
    want = dequantize(codes, params)
    assert np.array_equal(dequantize_on_device(packed, params, "cpu").numpy(), want)
    bad = codes.copy()
    bad[5] = 7  # 5 levels in 3 bits: codes 5-7 are not levels
    with pytest.raises(ValueError, match="outside the level range"):
        dequantize_on_device(PackedCodes(pack_bits(bad, 3), 64, 3), params, "cpu")
    with pytest.raises(ValueError, match="codes of 3 bits"):
        dequantize_on_device(PackedCodes(pack_bits(codes, 3), 63, 3), params, "cpu")
    checks: list[torch.Tensor] = []  # deferred: the flag is read once the chunk's stream is done
    dequantize_on_device(PackedCodes(pack_bits(bad, 3), 64, 3), params, "cpu", checks)
    dequantize_on_device(packed, params, "cpu", checks)
    assert [bool(b) for b in checks] == [True, False]


def test_a_segment_longer_than_its_chunk_costs_the_chunk():
    """A header may declare segments longer than the chunk (the codec accepts up to 2**48): one
    segment either way, decoded in the chunk's memory, not the declared length's."""
    from ckptcodecs import dequantize
    from ckptcodecs._qformat import decode_chunk_packed, encode_chunk

    from ckptstore.device.bits import PackedCodes

    codes, params = quantize(np.linspace(-1, 1, 64, dtype=np.float32), "uniform-asymmetric", 4,
                             granularity="tensor")
    want = dequantize(codes, params)
    for seg_len in (64, 1 << 20, 1 << 34):
        params.seg_len = seg_len
        packed, p = decode_chunk_packed(np.frombuffer(encode_chunk(codes, params), np.uint8))
        got = dequantize_on_device(PackedCodes(packed, p.count, p.bits), p, "cpu")
        assert np.array_equal(got.numpy(), want), seg_len


def test_only_accelerators_decode_on_the_device():
    assert not wants_device_decode(None) and not wants_device_decode("cpu")
    assert wants_device_decode("cuda") and wants_device_decode(torch.device("cuda", 1))


@pytest.fixture
def device_decode_on_cpu(monkeypatch):
    """Checkout with ``map_location="cpu"`` takes the device path (as "cuda" would); returns
    the list of tensors it produced."""
    import ckptstore.device.decode as devdecode

    made = []
    real = devdecode.start_read_to_device

    def spy(*args):
        out, futures = real(*args)
        made.append(out)
        return out, futures

    monkeypatch.setattr(reader_module, "wants_device_decode", lambda loc: loc is not None)
    monkeypatch.setattr(reader_module, "start_read_to_device", spy)
    return made


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(700, 96, generator=g)
    w[3, 3] = float("nan")
    return {"w": w, "b": torch.randn(300, 257, generator=g).to(torch.bfloat16),
            "h": torch.randn(5000, generator=g).half(), "i": torch.arange(30000),
            "t": torch.randn(128, 300, generator=g).t(),  # dim_order: the host path
            "step": seed}


@pytest.mark.parametrize("spec", [QuantSpec(bits=4), QuantSpec("kmeans", 4, protect=0.01),
                                  QuantSpec("uniform-symmetric", 8, "tensor")],
                         ids=["adaptive", "kmeans", "uniform"])
def test_checkout_to_the_device_equals_the_host_checkout(tmp_path, device_decode_on_cpu, spec):
    store = ckptstore.open(tmp_path / "s", options=ckptstore.EncodingOptions(
        chunk_bytes=32 << 10))
    policy = Policy(quantize=spec, delta=True, max_chain=4, min_quant_bytes=1)
    for seed in range(3):  # a quantized baseline, then two links of code deltas
        store.commit(_state(seed), policy=policy)
    host = store.checkout("main")
    assert not device_decode_on_cpu
    got = store.checkout("main", map_location="cpu")
    assert len(device_decode_on_cpu) == 3  # w, b, h; "i" is lossless, "t" has a dim_order
    for k, v in host.items():
        if isinstance(v, torch.Tensor):
            assert v.dtype == got[k].dtype and v.stride() == got[k].stride(), k
            assert np.array_equal(_bits(v).view(np.uint8), _bits(got[k]).view(np.uint8)), k
        else:
            assert got[k] == v
    first = store.log()[-1].id  # the full quantized baseline alone
    for k, v in store.checkout(first).items():
        if isinstance(v, torch.Tensor):
            w = store.checkout(first, map_location="cpu")[k]
            assert np.array_equal(_bits(v).view(np.uint8), _bits(w).view(np.uint8)), k


def test_a_corrupted_chunk_is_reported_on_the_device_path(tmp_path, device_decode_on_cpu):
    store = ckptstore.open(tmp_path / "s")
    store.commit({"w": torch.randn(256, 64)}, policy=Policy(quantize=QuantSpec(bits=4),
                                                             min_quant_bytes=1))
    chunk = next((tmp_path / "s" / "data").glob("*/w/c/0/0"))
    data = bytearray(chunk.read_bytes())
    data[40] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(CorruptedChunkError, match="crc32c"):
        store.checkout("main", map_location="cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CI has none)")
def test_checkout_to_cuda_equals_the_host_checkout(tmp_path):
    store = ckptstore.open(tmp_path / "s")
    store.commit(_state(0), policy=Policy(quantize=QuantSpec(bits=4), min_quant_bytes=1))
    host = store.checkout("main")
    got = store.checkout("main", map_location="cuda")
    for k, v in host.items():
        if isinstance(v, torch.Tensor):
            assert got[k].is_cuda
            assert np.array_equal(_bits(v).view(np.uint8), _bits(got[k].cpu()).view(np.uint8))
