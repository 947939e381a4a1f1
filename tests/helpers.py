"""Assertions and probes shared by the tests."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch


def assert_bit_exact(a: Any, b: Any, path: str = "") -> None:
    """Recursively assert two states are identical: same types, dtypes, shapes and bits."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), f"{path}: {type(b)} is not a tensor"
        assert a.dtype == b.dtype and a.shape == b.shape, f"{path}: {b.dtype}{tuple(b.shape)}"
        av, bv = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
        if av.element_size() in width and not av.is_complex():
            av, bv = av.view(width[av.element_size()]), bv.view(width[bv.element_size()])
        else:
            av, bv = torch.view_as_real(av), torch.view_as_real(bv)
        assert torch.equal(av, bv), f"{path}: values differ"
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, path
        assert a.tobytes() == b.tobytes(), f"{path}: values differ"
    elif isinstance(a, np.generic):
        assert type(a) is type(b) and a.tobytes() == b.tobytes(), path
    elif isinstance(a, Mapping):
        assert isinstance(b, Mapping) and list(a.keys()) == list(b.keys()), f"{path}: keys"
        for k in a:
            assert_bit_exact(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{path}: {type(b)} len {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_bit_exact(x, y, f"{path}.{i}")
    elif isinstance(a, float) and a != a:
        assert isinstance(b, float) and b != b, path
    else:
        assert type(a) is type(b) and a == b, f"{path}: {a!r} != {b!r}"


def open_golden(path, script: str):
    """Open a checked-in golden store read-only; fail with how to create it if it is missing."""
    import pytest

    import ckptstore

    if not path.exists():
        pytest.fail(f"{path} is missing: run `python {script}` once and commit it")
    return ckptstore.open(path, create=False)


def write_golden_once(path, make) -> None:
    """``make(tmp)`` builds a golden store in a temporary folder that becomes ``path``; an
    existing golden store is never overwritten."""
    import shutil
    import sys

    if path.exists():
        sys.exit(f"{path} exists and is never overwritten")
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    make(tmp)
    tmp.rename(path)
    print(f"wrote {path}")


def assert_older_reader_refuses(manifest: Any, reader_version: int) -> None:
    """A reader of manifest format ``reader_version`` refuses ``manifest`` (a newer one) with a
    FormatVersionError that says to upgrade."""
    import pytest

    import ckptstore.history.manifest as manifest_module
    from ckptstore.errors import FormatVersionError

    raw = manifest_module.encode_manifest(manifest)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(manifest_module, "FORMAT_VERSION", reader_version)
        with pytest.raises(FormatVersionError, match="upgrade"):
            manifest_module.decode_manifest(raw)


def progress_during(call: Callable[[], object]) -> list[int]:
    """How far a counting thread got during each of a few calls. The switch interval is made
    so long that a thread holding the GIL is never made to drop it; the counter drops it at
    every step (``sleep(0)``), so it counts during a call only if the call released it."""
    stop, counts, seen = threading.Event(), [0], []

    def count() -> None:
        while not stop.is_set():
            counts[0] += 1
            time.sleep(0)

    interval = sys.getswitchinterval()
    counter = threading.Thread(target=count)
    counter.start()
    sys.setswitchinterval(1000.0)
    try:
        for _ in range(3):
            time.sleep(0.01)  # a wait for the GIL begun under the old interval ends here
            before = counts[0]
            call()
            seen.append(counts[0] - before)
    finally:
        sys.setswitchinterval(interval)
        stop.set()
        counter.join()
    return seen


def spins_during(call: Callable[[], object]) -> int:
    """How many times a Python thread spinning beside ``call()`` went round while it ran: above
    0 when ``call`` released the GIL (a call that holds it leaves the spinner still)."""
    spins, done = [0], threading.Event()

    def spin() -> None:
        while not done.is_set():
            spins[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.01)
    before = spins[0]
    try:
        call()
        return spins[0] - before
    finally:
        done.set()
        t.join()


def chunk_files(store: Any, root: Any) -> dict[str, bytes]:
    """Every chunk file of the local store at ``root`` by its path under ``data/``, the commit id
    replaced by its position in the history (stores that made the same commits compare equal)."""
    position = {info.id: n for n, info in enumerate(reversed(store.log()))}
    out = {}
    for f in sorted((root / "data").rglob("*")):
        if f.is_file():
            commit, *rest = f.relative_to(root / "data").parts
            out["/".join([str(position[commit]), *rest])] = f.read_bytes()
    return out
