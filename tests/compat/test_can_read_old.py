"""Every future ckptstore must read the format-v1 store checked in under tests/data/golden_v1.

Run this file as a script to create the golden store if it is missing (it is never overwritten):
``python tests/test_can_read_old.py``.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

GOLDEN = Path(__file__).parents[1] / "data" / "golden_v1"


def golden_state(version: int) -> dict:
    """The state of commit ``version`` of the golden store, rebuilt from seeds."""
    g = torch.Generator().manual_seed(1000 + version)
    emb = torch.randn(1024, 16, generator=g)
    base = torch.arange(3000, dtype=torch.float32) * (version + 1)
    return {
        "model": {
            "emb.weight": emb,
            "head.weight": emb,  # tied
            "fc.weight": torch.randn(32, 16, generator=g).to(torch.bfloat16),
            "fc.bias": torch.randn(32, generator=g, dtype=torch.float64),
            "mask": torch.rand(50, generator=g) > 0.5,
            "counts": torch.randint(-2**40, 2**40, (20,), generator=g),
            "c": torch.randn(4, dtype=torch.complex64, generator=g),
            "h": torch.randn(9, generator=g).half(),
            "i8": torch.randint(-128, 127, (9,), dtype=torch.int8, generator=g),
        },
        "views": {"left": base[:2000], "right": base[1000:]},
        "step": 100 * version,
        "rng": {"python": random.Random(version).getstate(),
                "numpy": np.random.RandomState(version).get_state()},
        "extra": {"lr": 0.1 / (version + 1), "name": "golden", "none": None, 3: b"\x00\x01",
                  "nested": [1, (2.5, "x"), {"big": 2**70}]},
    }


def make_golden(path: Path) -> None:
    """Write the golden store into ``path`` (a fresh folder)."""
    import ckptstore
    from ckptstore import EncodingOptions

    store = ckptstore.open(path, options=EncodingOptions(chunk_bytes=16 * 1024, pack_below=2048))
    store.commit(golden_state(0), message="v0")
    store.commit(golden_state(1), message="v1", tags=["best"])
    store.branch("exp", "main")
    store.commit(golden_state(2), message="v2 on exp", branch="exp")
    store.close()


@pytest.fixture(scope="module")
def golden():
    from helpers import open_golden

    return open_golden(GOLDEN, __file__)


def test_history_and_refs(golden):
    assert [c.message for c in golden.log("exp")] == ["v2 on exp", "v1", "v0"]
    assert golden.resolve("best") == golden.resolve("main")
    assert golden.info("main").step == 100


@pytest.mark.parametrize("ref,version", [("main~1", 0), ("best", 1), ("exp", 2)])
def test_states_bit_exact(golden, ref, version):
    from helpers import assert_bit_exact

    out = golden.checkout(ref)
    assert_bit_exact(out, golden_state(version))
    assert out["model"]["emb.weight"] is out["model"]["head.weight"]


def test_verify_clean(golden):
    report = golden.verify()
    assert report.ok and report.commits_checked == 3 and report.chunks_checked > 10


def test_plain_zarr_reads_golden(golden):
    import zarr

    commit = golden.resolve("exp")
    group = zarr.open_group(str(GOLDEN / "data" / commit), mode="r")
    emb = group["model.emb.weight"]
    assert emb.attrs["ckptstore"]["torch_dtype"] == "float32"
    assert np.array_equal(emb[:], golden_state(2)["model"]["emb.weight"].numpy())


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parents[1]))
    from helpers import write_golden_once

    write_golden_once(GOLDEN, make_golden)
