"""A read that runs out of memory says so in one line (issue 26 item 7): whichever buffer a
checkout cannot have -- the tensor, a dimension-order copy, a chain's baseline copy or code
deltas, a decoder's scratch, a quantized chunk decoded apart -- it is an
:class:`~ckptstore.errors.AllocationError` (a ``MemoryError``), never a raw ``MemoryError``,
and the process goes on (a later checkout with the memory back succeeds).

Each case commits a 64 MiB tensor (glibc maps buffers that large, so ``RLIMIT_AS`` bounds them
exactly) and checks it out in a child process under address-space limits from a little to a
lot above what the process holds after a first, small checkout of the same kind (imports,
kernels, pools)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import ckptstore
from ckptstore import Policy, QuantSpec

ROWS = COLS = 4096  # 64 MiB of float32
POLICIES = {"plain": None, "dim-order": None, "xor": Policy(delta=True),
            "code-deltas": Policy(delta=True, quantize=QuantSpec(bits=8)),
            "quantized": Policy(quantize=QuantSpec(bits=8)),
            "rows": Policy(incremental="consecutive")}
HEADROOM_MIB = [8, 40, 72, 104, 136, 400]

_CHILD = """
import gc, resource, sys
import ckptstore
store = ckptstore.open(sys.argv[1], create=False)
store.checkout("warm")
vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
for mib in map(int, sys.argv[2:]):
    resource.setrlimit(resource.RLIMIT_AS, (vm + mib * 2**20, resource.RLIM_INFINITY))
    got = None
    try:
        got = store.checkout("main")
        said = "loaded"
    except ckptstore.CkptStoreError as e:
        said = f"{type(e).__name__} {isinstance(e, MemoryError)} {str(e)[:120]}"
    except MemoryError as e:
        said = f"RAW {e!r:.200}"
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    print(said, float(got["m"].double().sum()) if got else "", flush=True)
    got = None
    gc.collect()
"""


def _store(path, kind: str) -> float:
    """A store whose ``warm`` tag is a small commit of ``kind`` and whose ``main`` is a 64 MiB
    one (the second of a chain for the chain kinds); the sum ``main`` must load to."""
    store = ckptstore.open(str(path), policy=POLICIES[kind])
    g = torch.Generator().manual_seed(0)

    def state(rows: int) -> dict[str, torch.Tensor]:
        t = torch.randn(rows, COLS, generator=g)
        return {"m": t.t() if kind == "dim-order" else t}

    store.commit(state(64))
    store.commit(state(64))
    store.tag("warm")
    s = state(ROWS)
    store.commit(s)
    with torch.no_grad():
        if kind == "rows":
            s["m"][:10] += 1
        else:
            s["m"].mul_(1.001)
    store.commit(s)
    return float(s["m"].double().sum())


@pytest.mark.parametrize("kind", list(POLICIES))
def test_a_checkout_out_of_memory_is_an_allocation_error(tmp_path, kind):
    want = _store(tmp_path / "s", kind)
    env = {**os.environ, "MALLOC_ARENA_MAX": "1"}  # arenas reserve 64 MiB of address space each
    out = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "s"),
                          *map(str, HEADROOM_MIB)], capture_output=True, text=True, timeout=300,
                         env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == len(HEADROOM_MIB), out.stdout + out.stderr[-2000:]
    assert not [line for line in lines if line.startswith("RAW")], out.stdout
    assert lines[0].startswith("AllocationError True"), out.stdout  # 8 MiB: not the tensor
    assert lines[-1].startswith("loaded"), out.stdout  # 400 MiB: the memory back
    for line in lines:
        assert line.startswith(("AllocationError True", "loaded")), out.stdout
        if line.startswith("loaded"):
            got = float(line.split()[1])
            assert abs(got - want) <= 1e-3 * max(1.0, abs(want)) or kind == "quantized" \
                or kind == "code-deltas", line
