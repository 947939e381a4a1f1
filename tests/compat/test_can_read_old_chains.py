"""Every future ckptstore must read the chain store checked in under tests/data/golden_v1_chains:
consecutive and one-shot row increments, quantized arrays (level and sparse protection), and
DynaQuant code deltas.

Lossless states are rebuilt from seeds; the dequantized values that the quantized commits decoded
to when the store was written are kept in ``expected.npz`` (numeric arrays only, loaded without
pickle). Run this file as a script to create the store if it is missing (never overwritten).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

GOLDEN = Path(__file__).parents[1] / "data" / "golden_v1_chains"


def lossless_state(version: int) -> dict:
    g = torch.Generator().manual_seed(77)
    emb = torch.randn(2048, 16, generator=g)
    for v in range(1, version + 1):
        rows = torch.randint(0, 2048, (100,), generator=torch.Generator().manual_seed(v))
        emb[rows] += v
    return {"emb": emb, "step": version}


def quant_state(version: int) -> dict:
    g = torch.Generator().manual_seed(88)
    emb = torch.randn(2048, 16, generator=g)
    dense = torch.randn(256, 128, generator=g)
    for v in range(1, version + 1):
        emb[v * 50: v * 50 + 50] += 0.5
        dense += 0.001 * v
    return {"emb": emb, "dense": dense.to(torch.bfloat16), "step": version}


def make_golden(path: Path) -> None:
    """Write the golden store into ``path`` (a fresh folder)."""
    import ckptstore
    from ckptstore import Policy, QuantSpec

    store = ckptstore.open(path)
    lossless = Policy(incremental="consecutive", min_quant_bytes=16 * 1024, min_rows=1024)
    for v in range(3):
        store.commit(lossless_state(v), message=f"lossless v{v}", policy=lossless)
    store.branch("quant", "main~2")
    quant = Policy(incremental="one-shot", min_quant_bytes=16 * 1024, delta=True,
                   quantize=QuantSpec(method="adaptive-asymmetric", bits=4),
                   overrides=(("dense", QuantSpec(method="kmeans", bits=4, granularity="tensor",
                                                  protect=0.01, protect_mode="sparse")),))
    expected = {}
    for v in range(3):
        info = store.commit(quant_state(v), message=f"quant v{v}", branch="quant", policy=quant)
        out = store.checkout(info.id)
        expected[f"emb{v}"] = out["emb"].numpy()
        expected[f"dense{v}"] = out["dense"].view(torch.int16).numpy()
    store.close()
    np.savez(path / "expected.npz", **expected)


@pytest.fixture(scope="module")
def golden():
    from helpers import open_golden

    return open_golden(GOLDEN, __file__)


def test_kinds_are_what_they_were(golden):
    kinds = [[e.kind for e in golden.manifest(c.id).tensors] for c in golden.log("quant")]
    assert kinds[:3] == [["incremental", "delta"], ["incremental", "delta"], ["full", "full"]]
    assert [golden.manifest(c.id).tensors[0].kind for c in golden.log("main")] == [
        "consecutive", "consecutive", "full"]


@pytest.mark.parametrize("version", [0, 1, 2])
def test_lossless_chain_bit_exact(golden, version):
    from helpers import assert_bit_exact

    assert_bit_exact(golden.checkout(f"main~{2 - version}"), lossless_state(version))


@pytest.mark.parametrize("version", [0, 1, 2])
def test_quantized_chain_decodes_as_written(golden, version):
    expected = np.load(GOLDEN / "expected.npz", allow_pickle=False)
    out = golden.checkout(f"quant~{2 - version}")
    assert np.array_equal(out["emb"].numpy(), expected[f"emb{version}"])
    assert out["dense"].dtype == torch.bfloat16
    assert np.array_equal(out["dense"].view(torch.int16).numpy(), expected[f"dense{version}"])
    assert out["step"] == version


def test_verify_clean(golden):
    report = golden.verify()
    assert report.ok and report.commits_checked == 6


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parents[1]))
    from helpers import write_golden_once

    write_golden_once(GOLDEN, make_golden)
