"""``commit_async`` beside processes that keep every core busy (issue 26, item 1): the training
loop keeps going and every commit lands, whatever the background priority's default; a starved
persist raises itself to normal priority until it ends (issue 28)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
import torch

import ckptstore
from ckptstore import EncodingOptions
from ckptstore.priority import LOW_NICE, starved

#: generous: a loop that is merely slow finishes well within it; only a freeze reaches it
HANG_GUARD_S = 90.0
COMMITS = 3
STEPS = 100  # loop steps between two commits


def busy_processes() -> list[subprocess.Popen]:
    """One CPU-bound process per core this process may use (at least two), at normal priority."""
    n = max(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2)
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def python_bound_loop(store: ckptstore.Store, state: dict, landed: list) -> None:
    """A training loop as the CPU sees it: small torch ops launched from Python, a
    ``commit_async`` every :data:`STEPS` steps, then the last commit waited for."""
    x, w = torch.randn(32, 32), torch.randn(32, 32) * 0.1
    pending = None
    for step in range(1, COMMITS * STEPS + 1):
        x = torch.tanh(x @ w).clamp(-1, 1)
        if step % STEPS == 0:
            state["step"] = step
            pending = store.commit_async(state, message=f"step {step}")
    landed.append(pending.wait())


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs Linux CPU affinity")
def test_training_loop_keeps_going_while_every_core_is_busy(tmp_path):
    """With every core taken by busy processes, a Python-bound loop that commits asynchronously
    finishes and all its commits land: the persist it waits for cannot starve (before: the
    default SCHED_IDLE persist got no CPU and the loop froze in the next commit_async)."""
    state = {"w": torch.randn(1024, 2048), "b": torch.randn(4096), "step": 0}  # 8 MB
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    store = ckptstore.open(tmp_path / "s")
    busy = busy_processes()  # from the first commit on, as DataLoader workers would be
    landed: list = []
    try:
        with store:
            loop = threading.Thread(target=python_bound_loop, args=(store, state, landed),
                                    daemon=True)
            loop.start()
            loop.join(HANG_GUARD_S)
            frozen = loop.is_alive()
            for p in busy:  # let a starved persist finish, so that the store closes
                p.kill()
            loop.join()
            assert not frozen, f"the training loop froze beside {len(busy)} busy processes"
            assert [c.metadata["step"] for c in store.log()] == [
                STEPS * k for k in range(COMMITS, 0, -1)]
            assert landed and landed[0].metadata["step"] == COMMITS * STEPS
    finally:
        for p in busy:
            p.kill()
            p.wait()
        torch.set_num_threads(threads)


def test_starved_means_a_fifth_of_a_core_alone_and_under_half_together():
    """The judgement :meth:`BackgroundThreads.observe` makes from a thread's share of a core
    while it was runnable and the shares of the threads lately runnable."""
    assert starved(0.05, [0.05, 0.05, 0.05])  # three threads beside busy processes
    assert not starved(0.1, [1.0, 0.1])  # one beside the training thread, one on a free core
    assert not starved(0.45, [0.45])  # the first of two sharing a free core to judge
    assert not starved(0.15, [0.15, 0.4])  # half a core between them
    assert starved(0.1, [0.1])


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"),
                    reason="needs Linux per-thread scheduler statistics")
def test_a_starved_persist_runs_at_normal_priority_until_it_ends(tmp_path, neighbours):
    """Busy processes on every core starve a low-priority persist: its threads notice it from
    their scheduler statistics and run at normal priority -- before anyone waits for the commit
    --, the next persist starts so, and they go back to their low priority once it has
    landed."""
    state = {"w": torch.randn(2048, 4096)}  # 32 MB in 32 chunks of 1 MiB
    store = ckptstore.open(tmp_path / "s", options=EncodingOptions(chunk_bytes=1 << 20),
                           background="thread")  # the persist thread's priority
    with store:
        store.commit_async(state).wait()  # the background threads exist
        background = store._committer.background
        low = os.getpriority(os.PRIO_PROCESS, 0) + LOW_NICE
        starved_before = background.starved_persists
        busy = busy_processes()
        try:
            landed = []
            for _ in range(2):  # the second starts raised: the cores are still taken
                pending = store.commit_async(state)
                deadline = time.monotonic() + HANG_GUARD_S
                while not pending.done() and time.monotonic() < deadline:
                    time.sleep(0.05)  # not wait(): a waiter would raise the threads itself
                assert pending.done(), "the starved persist did not finish without a waiter"
                landed.append(pending.wait().id)
        finally:
            for p in busy:
                p.kill()
                p.wait()
        assert landed == [c.id for c in store.log()[1::-1]]
        assert background.starved_persists == starved_before + 2
        io = [t.native_id for t in threading.enumerate()  # this store's, not others left open
              if t.name.startswith("ckptstore-bg-io") and t.native_id in background.thread_ids]
        assert io and all(os.getpriority(os.PRIO_PROCESS, t) == min(19, low) for t in io)
