"""The library writes the same bytes as commit 9f87563 (issue 27's refactoring guard).

Every scenario of ``same_bytes.py`` (a policy's 7-commit sequence, or the 2-rank sharded commit)
is committed with the working tree's library and its fingerprint -- one hash per array (over its
chunks' sha256) and per manifest entry, commit ids replaced by ordinals, only the commit time
dropped -- compared with ``tests/data/same_bytes.json``, written from 9f87563 by
``benchmarks/same_bytes_revisions.py --write 9f87563``. A failure names the scenario, the commit
ordinal and the array or manifest entry; ``benchmarks/same_bytes_revisions.py --base 9f87563``
then lists the chunks that differ.

Checked deterministic on this VM (2 cores, AMD EPYC, numba target znver4): two runs, ``-n 2``
workers, ``io_workers`` 1 and 8, torch threads 1 and 2 give the same fingerprint, and so do numba
kernels compiled for ``NUMBA_CPU_NAME=haswell`` (AVX2 + FMA). Compiled for ``generic`` x86-64
(no FMA), the adaptive quantizer's bf16 chunks differ (its search kernels use ``fastmath``, which
lets LLVM contract into FMAs): only there, and only on such a CPU, is that array tolerated
(:data:`NO_FMA_TOLERATED`).

Regenerate the JSON only when a change of the written bytes is intended (and say so in the
commit): ``python benchmarks/same_bytes_revisions.py --write <the new revision>``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import same_bytes
import torch

EXPECTED = Path(__file__).parents[1] / "data" / "same_bytes.json"
#: what differs where numba compiles without FMA (``NUMBA_CPU_NAME=generic``: measured, 12 lines):
#: quant-adaptive4's bf16 array and, with it, the commit's stored bytes
NO_FMA_TOLERATED = ("quant-adaptive4 commit {} array model.norm.weight:",
                    "quant-adaptive4 commit {} manifest stored_bytes:")


def _numba_has_fma() -> bool:
    from llvmlite import binding
    from numba.core import config

    if config.CPU_NAME:  # NUMBA_CPU_NAME: numba compiles for that CPU
        return config.CPU_NAME != "generic" and "-fma" not in (config.CPU_FEATURES or "")
    return "+fma" in binding.get_host_cpu_features().flatten().split(",")


def _machine_free(diffs: list[str]) -> list[str]:
    if _numba_has_fma():
        return diffs
    tolerated = tuple(t.format(i) for t in NO_FMA_TOLERATED for i in range(same_bytes.COMMITS))
    return [d for d in diffs if not d.startswith(tolerated)]


@pytest.fixture(scope="module")
def expected():
    meta, scenarios = same_bytes.load(str(EXPECTED))
    assert set(scenarios) == set(same_bytes.SCENARIOS), "regenerate: see the module docstring"
    return scenarios


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return same_bytes.fingerprint(tmp=str(tmp_path_factory.mktemp("same-bytes")))


def _report(diffs: list[str]) -> str:
    head = "\n".join(diffs[:40])
    more = f"\n... {len(diffs) - 40} more" if len(diffs) > 40 else ""
    return (f"{len(diffs)} differences from tests/data/same_bytes.json (9f87563):\n{head}{more}\n"
            "details: python benchmarks/same_bytes_revisions.py --base 9f87563")


def test_same_bytes_as_9f87563(expected, made):
    diffs = _machine_free(same_bytes.compare(expected, made))
    assert not diffs, _report(diffs)


@pytest.mark.parametrize("a, b", [("xor", "xor-async"), ("rows-consecutive-q8", "rows-async-q8"),
                                  ("quant-uniform8", "quant-device8"), ("codes", "codes-device")])
def test_every_path_writes_the_same_chunks(made, a, b):
    """commit_async and the device quantizer (``device_encode="always"``) write the chunks
    Store.commit writes (the messages, hence the manifests, differ)."""
    da, db = same_bytes.digest({a: made[a]})[a], same_bytes.digest({b: made[b]})[b]
    assert [c["arrays"] for c in da] == [c["arrays"] for c in db]


def test_same_bytes_with_one_thread(expected, tmp_path):
    """One I/O thread and one torch thread give the same bytes as the defaults."""
    names = ["quant-adaptive4", "shrink", "sharded-2-ranks"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        got = same_bytes.fingerprint(names, io_workers=1, tmp=str(tmp_path))
    finally:
        torch.set_num_threads(threads)
    diffs = _machine_free(same_bytes.compare({n: expected[n] for n in names}, got))
    assert not diffs, _report(diffs)


def test_a_difference_names_scenario_commit_and_array(expected):
    got = copy.deepcopy(expected)
    got["codes"][3]["arrays"]["model.fc1.weight.codes"] = "0" * 12
    got["xor"][5]["manifest"]["tensors[model.emb.weight]"] = "1" * 12
    del got["dedup"][2]["arrays"]["_packed"]
    diffs = same_bytes.compare(expected, got)
    assert len(diffs) == 3, diffs
    assert diffs[0].startswith("codes commit 3 array model.fc1.weight.codes: expected")
    assert diffs[1].startswith("dedup commit 2 array _packed: missing")
    assert diffs[2].startswith("xor commit 5 manifest tensors[model.emb.weight]: expected")
    assert same_bytes.compare(expected, expected) == []
