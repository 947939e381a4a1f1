"""The device paths on a real CUDA device (issue 30): every test runs a CUDA state through the
store and compares what it wrote or read, byte for byte, with the host path on the same values
on the CPU. CI has no GPU: there the same code runs on CPU tensors under
``device_encode="always"`` (test_device_encode, test_device_rows, test_device_decode,
test_placement), and these tests are skipped."""

from __future__ import annotations


import numpy as np
import pytest
import torch

import ckptstore
from helpers import assert_bit_exact, chunk_files
from ckptstore import EncodingOptions, Policy, QuantSpec

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device (CI has none)")

ROWS, DIM = 3000, 16


def _state(step: int, dtype: torch.dtype = torch.float32) -> dict:
    """An embedding table some rows of which move each step, dense weights of every float
    dtype, a strided view, integers and a scalar: on the CPU."""
    g = torch.Generator().manual_seed(0)
    table = torch.randn(ROWS, DIM, generator=g)
    for s in range(1, step + 1):
        rows = torch.randperm(ROWS, generator=torch.Generator().manual_seed(s))[: 40 * s]
        table[rows] += 0.01 * s
        table[s, 3] = float("nan")
    return {"emb": table.to(dtype), "w": torch.randn(700, 96, generator=g) + step,
            "b": (torch.randn(300, 257, generator=g) + step).to(torch.bfloat16),
            "h": (torch.randn(5000, generator=g) + step).half(),
            "t": (torch.randn(512, 64, generator=g) + step).t(),
            "i": torch.arange(30000) + step, "small": torch.randn(10, generator=g),
            "step": step}


def _cuda(state: dict) -> dict:
    return {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}


POLICIES = {
    "lossless": Policy(),
    "8-bit uniform": Policy(quantize=QuantSpec("uniform-asymmetric", 8), min_quant_bytes=1),
    "4-bit adaptive": Policy(quantize=QuantSpec(bits=4), min_quant_bytes=1),
    "4-bit k-means": Policy(quantize=QuantSpec("kmeans", 4, protect=0.01), min_quant_bytes=1),
    "consecutive, lossless": Policy(incremental="consecutive", max_chain=3),
    "intermittent + 4-bit": Policy(incremental="intermittent", quantize=QuantSpec(bits=4),
                                   min_quant_bytes=1),
    "8-bit, code deltas": Policy(quantize=QuantSpec(bits=8), delta=True, max_chain=3,
                                 min_quant_bytes=1),
}


@pytest.mark.parametrize("name", list(POLICIES))
@pytest.mark.parametrize("asynchronous", [False, True], ids=["commit", "commit_async"])
def test_cuda_commits_equal_the_host_commits(tmp_path, name, asynchronous):
    """Quantized, compared and staged on the GPU ("auto"): the chunk files of the same commits
    of the same values on the CPU ("off"), and the checkouts equal bit for bit."""
    stores = {mode: ckptstore.open(tmp_path / mode, policy=POLICIES[name],
                                   options=EncodingOptions(device_encode=mode))
              for mode in ("auto", "off")}
    for step in range(4):
        state = _state(step)
        for mode, store in stores.items():
            s = _cuda(state) if mode == "auto" else state
            (store.commit_async(s).wait() if asynchronous else store.commit(s))
    assert chunk_files(stores["auto"], tmp_path / "auto") == chunk_files(stores["off"],
                                                                         tmp_path / "off")
    assert_bit_exact(*(stores[m].checkout("main") for m in ("auto", "off")))
    for store in stores.values():
        store.close()


def test_the_chain_reference_is_kept_on_the_gpu(tmp_path):
    """An incremental policy on a CUDA table keeps its reference there (the rows are compared
    on the device) and the store reports those device bytes."""
    with ckptstore.open(tmp_path / "s", policy=Policy(incremental="consecutive", max_chain=4)
                        ) as store:
        store.commit(_cuda(_state(0)))
        store.commit(_cuda(_state(1)))
        host, device = store.committer.reference_bytes()
        assert device >= ROWS * DIM * 4
        assert store.manifest(store.log()[0].id).tensors[0].kind.value == "consecutive"


def test_the_snapshot_is_the_values_at_the_call(tmp_path):
    """Training kernels queued right after ``commit_async`` (on the training stream) change
    none of what is stored, whether the snapshot is staged on the device or in pinned memory."""
    for mode in ("auto", "off"):
        with ckptstore.open(tmp_path / mode, options=EncodingOptions(device_encode=mode),
                            policy=Policy(quantize=QuantSpec(bits=8), min_quant_bytes=1)
                            ) as store:
            w = torch.randn(4_000_000, device="cuda")
            e = torch.randn(2000, 512, device="cuda")
            want = {"w": w.clone(), "e": e.clone()}
            pending = store.commit_async({"w": w, "e": e})
            for _ in range(20):  # long enough to overlap the copies
                w.mul_(1.5).add_(1.0)
                e.zero_()
            info = pending.wait()
            ref = ckptstore.open(tmp_path / f"{mode}-ref",
                                 policy=Policy(quantize=QuantSpec(bits=8), min_quant_bytes=1))
            ref.commit({k: v.cpu() for k, v in want.items()})
            assert_bit_exact(store.checkout(info.id), ref.checkout("main"), mode)


@pytest.mark.parametrize("spec", [None, QuantSpec(bits=8), QuantSpec(bits=4),
                                  QuantSpec("kmeans", 4, protect=0.01)],
                         ids=["lossless", "8-bit", "4-bit", "kmeans"])
def test_checkout_to_cuda_equals_the_host_checkout(tmp_path, spec):
    """Quantized chunks dequantized on the GPU (``map_location="cuda"``), code-delta chains
    included: the host checkout's values, bit for bit, on the GPU."""
    with ckptstore.open(tmp_path / "s", options=EncodingOptions(chunk_bytes=32 << 10)) as store:
        policy = Policy(quantize=spec, delta=spec is not None, max_chain=4, min_quant_bytes=1)
        for step in range(3):
            store.commit(_state(step), policy=policy)
        for ref in ("main", "main~2"):
            host = store.checkout(ref)
            got = store.checkout(ref, map_location="cuda")
            for k, v in host.items():
                if isinstance(v, torch.Tensor):
                    assert got[k].is_cuda and v.stride() == got[k].stride(), k
            assert_bit_exact(got, host, ref)


def test_checkout_into_cuda_tensors_fills_them_in_place(tmp_path):
    with ckptstore.open(tmp_path / "s", policy=Policy(quantize=QuantSpec(bits=8),
                                                      min_quant_bytes=1)) as store:
        store.commit(_state(1))
        want = store.checkout("main")
        live = {k: torch.zeros_like(v, device="cuda") for k, v in want.items()
                if isinstance(v, torch.Tensor)}
        ptrs = {k: v.data_ptr() for k, v in live.items()}
        store.checkout("main", into=live)
        assert {k: v.data_ptr() for k, v in live.items()} == ptrs
        assert_bit_exact(live, {k: want[k] for k in live})


def test_quantized_codes_on_the_gpu_equal_the_host_kernels():
    """The torch kernels of every method give the host's codes and parameters on the GPU."""
    from ckptcodecs import quantize

    from ckptstore.device.quant import quantize_on_device

    rng = np.random.default_rng(0)
    cases = [{"method": "uniform-asymmetric", "bits": 4, "granularity": "row"},
             {"method": "uniform-symmetric", "bits": 8, "granularity": "tensor"},
             {"method": "uniform-asymmetric", "bits": 3, "granularity": "group",
              "group_size": 100},
             {"method": "adaptive-asymmetric", "bits": 4, "granularity": "row"},
             {"method": "adaptive-asymmetric", "bits": 2, "granularity": "tensor"},
             {"method": "kmeans", "bits": 4, "granularity": "tensor", "lam": 0.5},
             {"method": "kmeans", "bits": 2, "granularity": "row"}]
    on_device = 0
    for case in cases:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            x = torch.from_numpy(rng.standard_normal((1024, 96)) ** 3).clamp(-6e4, 6e4).to(dtype)
            kw = dict(case, dtype="bfloat16") if dtype == torch.bfloat16 else case
            got = quantize_on_device(x.cuda(), kw)
            if got is None:
                continue
            on_device += 1
            bits = x.view(torch.uint16).numpy() if dtype == torch.bfloat16 else x.numpy()
            want_codes, want = quantize(bits, **kw)
            codes = got[0].unpack() if hasattr(got[0], "unpack") else got[0].cpu().numpy()
            np.testing.assert_array_equal(codes, want_codes, err_msg=str((kw, dtype)))
            for name in ("zero", "scale", "codebook"):
                a, b = getattr(got[1], name, None), getattr(want, name, None)
                assert (a is None and b is None) or np.array_equal(a, b), (kw, dtype, name)
    assert on_device >= 15


def test_changed_rows_on_the_gpu_equal_the_host_kernels():
    """Rows compared on the GPU: the host kernel's rows, and their bits (XOR-ed with the
    reference's for exact chains)."""
    from ckptstore.chains.replay import changed_rows
    from ckptstore.device.rows import changed_rows_on_device

    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    rng = np.random.default_rng(4)
    for dtype in (torch.float32, torch.bfloat16, torch.float64, torch.int64):
        ref = torch.from_numpy(rng.standard_normal((5000, 33)) * 100).to(dtype)
        cur = ref.clone()
        cur[torch.from_numpy(rng.choice(5000, 300, replace=False))] += 1
        a, b = (t.view(ints[t.element_size()]) for t in (cur, ref))
        want_rows = changed_rows(a.numpy(), b.numpy())
        assert len(want_rows) == 300
        for xor in (False, True):
            rows, values = changed_rows_on_device(cur.cuda(), ref.cuda(), xor)
            np.testing.assert_array_equal(rows, want_rows)
            idx = torch.from_numpy(want_rows)
            want = a[idx] ^ b[idx] if xor else a[idx]
            assert bytes(np.ascontiguousarray(values).view(np.uint8)) == bytes(
                want.contiguous().view(torch.uint8).numpy()), (dtype, xor)


def test_reserve_pins_the_host_buffers_ahead(tmp_path):
    with ckptstore.open(tmp_path / "s", options=EncodingOptions(device_encode="off")) as store:
        state = _cuda(_state(0))
        assert store.reserve(state).result() > 0
        held = store.staging_bytes
        info = store.commit_async(state).wait()
        assert store.staging_bytes == held
        assert_bit_exact(store.checkout(info.id), state)


def test_a_persist_process_stores_the_threads_bytes(tmp_path):
    """``background="process"``: a CUDA state copied into the shared snapshot, persisted by the
    store's own process, writes the chunk files of the thread's commits."""
    policy = Policy(incremental="consecutive", quantize=QuantSpec(bits=8), max_chain=3,
                    min_quant_bytes=1)
    stores = {bg: ckptstore.open(tmp_path / bg, background=bg, policy=policy)
              for bg in ("process", "thread")}
    for step in range(3):
        state = _cuda(_state(step))
        for store in stores.values():
            store.commit_async(state).wait()
    assert chunk_files(stores["process"], tmp_path / "process") == chunk_files(
        stores["thread"], tmp_path / "thread")
    for store in stores.values():
        store.close()


def test_the_room_rule_reads_the_gpus_memory():
    from ckptstore.device.memory import DEVICE_FREE_FLOOR, allocate_if_room, has_room

    dev = torch.device("cuda")
    free, total = torch.cuda.mem_get_info(dev)
    assert has_room(dev, 1 << 20)
    assert not has_room(dev, int(free - DEVICE_FREE_FLOOR * total) + (1 << 30))
    assert allocate_if_room(dev, 1 << 40, lambda: torch.empty(1 << 40, dtype=torch.uint8,
                                                               device=dev)) is None
    t = allocate_if_room(dev, 1 << 20, lambda: torch.empty(1 << 20, dtype=torch.uint8,
                                                            device=dev))
    assert t is not None and t.is_cuda


def test_snapshot_copies_never_wait_for_training_on_the_cpu():
    """Behind a long kernel on the training stream, a batch of copies (whole tensors and a
    tracker's rows) returns while that kernel still runs, and the copies hold the values of
    before the training step queued after them."""
    import numpy as np

    from ckptstore.commit.staging import StagingPool

    t = torch.randn(100_000, 64, device="cuda")
    rows = np.arange(0, 100_000, 20, dtype=np.int64)
    pool = StagingPool()
    with pool.side.batch():  # the buffers allocated
        pool.stage("t", t)
        pool.stage_rows("r", t, rows)
    torch.cuda.synchronize()
    want = t.cpu().numpy().copy()
    torch.cuda._sleep(1 << 31)  # about a second of GPU time on the training stream
    with pool.side.batch():
        host, dense_done = pool.stage("t", t)
        picked, rows_done = pool.stage_rows("r", t, rows)
    still_running = not torch.cuda.current_stream().query()
    t.add_(1.0)  # the next training step, in place
    dense_done.synchronize()
    rows_done.synchronize()
    assert still_running
    assert np.array_equal(host, want) and np.array_equal(picked, want[rows])


def test_tracked_rows_of_a_cuda_table_equal_the_cpu_commits(tmp_path):
    """A row tracker on a CUDA embedding table: commit_async stages only the touched rows (on
    the side stream) and the increments restore what the same steps give on the CPU."""
    got = {}
    for device in ("cuda", "cpu"):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(20_000, 32, sparse=True).to(device)
        model = torch.nn.ModuleDict({"emb": emb})
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        tracker = ckptstore.track(model, opt)
        with ckptstore.open(tmp_path / device, policy=Policy(incremental="one-shot")) as store:
            store.commit({"model": model}, tracker=tracker)
            g = torch.Generator().manual_seed(1)
            for step in range(3):
                emb(torch.randint(0, 20_000, (1000 * (step + 1),), generator=g).to(device)
                    ).sum().backward()
                opt.step()
                opt.zero_grad()
                info = store.commit_async({"model": model}, tracker=tracker).wait()
            assert store.manifest(info.id).tensors[0].kind == "incremental"
            got[device] = (store.checkout("main")["model"]["emb.weight"], emb.weight.detach())
    assert_bit_exact(got["cuda"][0], got["cuda"][1])
    assert torch.equal(got["cuda"][0], got["cpu"][0])
