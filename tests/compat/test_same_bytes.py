"""The library writes the bytes of commit 18d521a (issue 27's refactoring guard).

Every scenario of ``same_bytes.py`` (a policy's 7-commit sequence, or the 2-rank sharded commit)
is committed with the working tree's library and its fingerprint -- one hash per array (over its
chunks' sha256) and per manifest entry, commit ids replaced by ordinals, only the commit time
dropped -- compared with ``tests/data/same_bytes.json``, written from 18d521a by
``benchmarks/same_bytes_revisions.py --write 18d521a``. A failure names the scenario, the commit
ordinal and the array or manifest entry; ``benchmarks/same_bytes_revisions.py --base 18d521a``
then lists the chunks that differ.

Why 18d521a and not 9f87563, the guard's first base: the adaptive range search became
deterministic on port-adaptive (6232f39: its numba reference lost ``fastmath``, which let LLVM
contract into FMAs where the CPU has them; its C twin is plain IEEE in the same order; 18d521a
has the same search, vectorised over segments). That changed the bytes of one scenario once:
quant-adaptive4's bf16 array (model.norm.weight, commits 2 and 3) and those commits' stored
bytes (2 more); every other scenario's fingerprint is 9f87563's. The bytes no longer depend on
the CPU (before, that array differed where numba compiled without FMA).

Checked deterministic on this VM (2 cores, AMD EPYC, numba target znver4): two runs, ``-n 2``
workers, ``io_workers`` 1 and 8, torch threads 1 and 2 give the same fingerprint.

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
    return (f"{len(diffs)} differences from tests/data/same_bytes.json (18d521a):\n{head}{more}\n"
            "details: python benchmarks/same_bytes_revisions.py --base 18d521a")


def test_same_bytes_as_18d521a(expected, made):
    diffs = same_bytes.compare(expected, made)
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
    diffs = same_bytes.compare({n: expected[n] for n in names}, got)
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
