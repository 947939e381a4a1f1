"""CPU proxy of GPU training under asynchronous checkpoints (issue 11): how much a background
persist slows a Python-bound loop.

Usage::

    .venv/bin/python benchmarks/cpu_proxy.py                   # ~2 minutes
    .venv/bin/python benchmarks/cpu_proxy.py --seconds 4 --repeat 2
    # issue 26: 0 and 2 busy processes, the old default, the new one and normal side by side
    .venv/bin/python benchmarks/cpu_proxy.py --busy 0 2 --only lossless \\
        --priority idle-old idle low normal --seconds 6 --repeat 3      # ~8 minutes

What is measured
----------------
* The loop stands for a GPU training loop as the CPU sees it: a Python thread launching many
  small kernels. Here: one torch thread, each step 24 small torch ops on 32 x 32 tensors (a few
  microseconds each, so the loop is bound by Python and the GIL, like kernel launches).
* The state: ``--size`` MB of float32 (async_writer.py's synthetic state: two embedding-like
  tables, a dense matrix, 300 small tensors), or with ``--state minilm`` a real one: MiniLM's
  weights and AdamW moments after a 5-step fine-tune (lossless.py's), 271 MB. Every ``--interval`` seconds of loop time the loop
  calls ``store.commit_async(state)``; the persist runs in the background while the loop goes
  on. Configurations: no checkpoint; the lossless default (byte planes); raw bits
  (``compression="none"``); ``Policy(quantize=QuantSpec(bits=8))`` (``method="auto"``: plain
  uniform asymmetric at 8 bits, as Check-N-Run; RLE + Huffman only where a chunk's sample says
  it saves 8 %), the same with every chunk coded (``entropy_min_saving=0.0``, before) and with
  Check-N-Run's adaptive range search forced (``"adaptive-asymmetric"``, the default before),
  Check-N-Run's 4 bits (``QuantSpec(bits=4)``: ``"auto"`` searches adaptively there),
  and 8-bit encoded a kernel call a step, as before the one-call chunk encoder (issue 28);
  lossless and raw bits with chunk files written through the page cache, as before they went
  past it (``O_DIRECT``); lossless with BytePlanes' Huffman threshold at 0.985 of a byte, as
  before planes that save under 2 % stayed raw (issue 28); lossless and 8-bit with every
  compiled kernel call releasing the GIL, as before calls on less than 128 KiB kept it (issue
  28); lossless, raw bits, 8-bit and 4-bit persisted in a process of the store's own
  (``open(..., background="process")``: no interpreter lock shared with the loop); lossless
  with ``background="auto"`` (the default), in a session of its own as before issue 28's
  seventeenth slice, and with each chunk file and folder fsynced as before batched durability
  (``CKPTSTORE_DURABILITY=file``); each at the
  ``background_priority`` values of ``--priority`` (default: the store's default, ``low``);
  ``idle-old`` is ``SCHED_IDLE`` without the priority inheritance of issue 26 (the default
  before it), ``low-19`` is ``low`` at nice +19 instead of +10.
* ``--busy N ...``: the same with N CPU-bound processes (``while True: pass``, normal priority)
  beside the loop, as DataLoader workers keep cores busy (issue 26). They are stopped
  (SIGSTOP) outside the timed loop -- the warm-up commit and the final wait -- and by a
  watchdog once a run has taken 3x ``--seconds`` (a frozen loop: the "froze" column counts
  those runs; their rate is what the loop made until the busy processes stopped). "starved
  persists" counts, over the runs, the persists whose threads found themselves starved and ran
  at normal priority until they ended (issue 28; a persist process's own counted since its
  eighteenth slice).
* Steps per second over ``--seconds`` of loop time (after one untimed warm-up commit), each
  configuration ``--repeat`` times, interleaved; the slowdown is relative to the median rate
  without checkpoints; "paired" is the median over the rounds of the time a step takes against
  the bare copy's in the same round (the runs of a round are minutes apart at most, while the
  rate drifts by 10 % and more over a benchmark on a VM). Goals (issue 11): lossless <= 15 %, 8-bit <= 20 % on the 2-core VM,
  and every policy <= 1.1x the slowdown of a bare copy of the state into preallocated buffers
  on the loop's thread at the same interval (its own configuration).
* "loop slept": what the rate hides under the drift of the cores' speed -- the seconds a commit
  the loop's thread was neither on a core nor waiting for one (``/proc/thread-self/schedstat``
  against the wall clock: asleep, waiting for the GIL or for a persist to end), and how many
  times it went to sleep (voluntary context switches), medians over the runs. Without a
  background persist the loop never sleeps.
* ``--remote s3``: every store on a moto S3 server started in a process of its own (at nice
  ``--server-nice``), each run's store a prefix of one bucket, removed after the run; the
  column "S3 server CPU-s a commit" is that process's CPU over the loop by commit. The server
  shares the machine's cores with the loop, which a remote S3 does not: its share of the
  slowdown is the rig's, the HTTP client's (in the persist's process) is the store's.
* ``--remote tiered`` / ``tiered-s3``: every store a tiered one (``local=`` a folder of the
  run), its remote a local folder or a prefix on the moto server; the warm-up commit is pushed
  before the timed loop (with ``background="auto"``, its upload process then runs).
* ``--gil``: instead, what one persist takes from a thread that only wants the GIL: the main
  thread spins on ``time.perf_counter()`` while one ``commit_async`` persists, and every pause
  of more than 0.2 ms between two of its reads counts as time the persist's threads held the
  GIL (or the OS took the core); persist wall time and those pauses, medians of ``--repeat``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import NamedTuple

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from async_writer import build_state  # noqa: E402
from common import command_line, machine_description, markdown_table  # noqa: E402

import ckptstore  # noqa: E402
from ckptstore import EncodingOptions, Policy, QuantSpec  # noqa: E402
from ckptstore.commit import child, process  # noqa: E402
from ckptstore.storage.local import DURABILITY_ENV  # noqa: E402
from ckptcodecs import Quantize, _backend, planes, rle_huffman  # noqa: E402

CONFIGS = {
    "no checkpoint": None,
    "commit_async, lossless (default)": (EncodingOptions(), Policy()),
    "commit_async, raw bits": (EncodingOptions(compression="none"), Policy()),
    "commit_async, 8-bit": (EncodingOptions(), Policy(quantize=QuantSpec(bits=8))),
    "commit_async, 8-bit, every chunk entropy coded": (
        EncodingOptions(), Policy(quantize=QuantSpec(bits=8, entropy_min_saving=0.0))),
    "commit_async, 8-bit adaptive search": (
        EncodingOptions(), Policy(quantize=QuantSpec("adaptive-asymmetric", bits=8))),
    # Check-N-Run's 4-bit configuration: "auto" at 4 bits is the adaptive search
    "commit_async, 4-bit (auto: the adaptive search)": (
        EncodingOptions(), Policy(quantize=QuantSpec(bits=4))),
    # the adaptive method before its one-call chunk encoder (quantize's steps, a kernel call
    # each), and before that, before its early end too (every greedy walk to its end)
    "commit_async, 8-bit adaptive search, a kernel call a step (before)": (
        EncodingOptions(), Policy(quantize=QuantSpec("adaptive-asymmetric", bits=8)),
        "steps"),
    "commit_async, 8-bit adaptive search, steps and the whole walk (before)": (
        EncodingOptions(), Policy(quantize=QuantSpec("adaptive-asymmetric", bits=8)),
        "steps", "whole walk"),
    "commit_async, 4-bit (auto), a kernel call a step (before)": (
        EncodingOptions(), Policy(quantize=QuantSpec(bits=4)), "steps"),
    "commit_async, 4-bit (auto), steps and the whole walk (before)": (
        EncodingOptions(), Policy(quantize=QuantSpec(bits=4)), "steps", "whole walk"),
    # before the one-call chunk encoder: quantize's steps, a kernel call (and a wait for the
    # GIL after it) each
    "commit_async, 8-bit, a kernel call a step (before)": (
        EncodingOptions(), Policy(quantize=QuantSpec(bits=8)), "steps"),
    # before chunk files went past the page cache (O_DIRECT): cached, written back, dropped
    "commit_async, lossless, through the page cache (before)": (
        EncodingOptions(), Policy(), "cached"),
    "commit_async, raw bits, through the page cache (before)": (
        EncodingOptions(compression="none"), Policy(), "cached"),
    # before BytePlanes left planes that save under 2 % raw: the synthetic state's lowest plane
    # (sampled entropy 0.9845 of a byte) Huffman coded
    "commit_async, lossless, planes coded below 0.985 (before)": (
        EncodingOptions(), Policy(), "huffman 0.985"),
    # before kernels on less than 128 KiB kept the GIL: every call released it
    "commit_async, lossless, every kernel call releases the GIL (before)": (
        EncodingOptions(), Policy(), "every call"),
    "commit_async, 8-bit, every kernel call releases the GIL (before)": (
        EncodingOptions(), Policy(quantize=QuantSpec(bits=8)), "every call"),
    # open(..., background="process"): the persist in a process of the store's own
    "commit_async, lossless, in a persist process": (EncodingOptions(), Policy(), "process"),
    "commit_async, raw bits, in a persist process": (
        EncodingOptions(compression="none"), Policy(), "process"),
    "commit_async, 8-bit, in a persist process": (
        EncodingOptions(), Policy(quantize=QuantSpec(bits=8)), "process"),
    "commit_async, 4-bit (auto), in a persist process": (
        EncodingOptions(), Policy(quantize=QuantSpec(bits=4)), "process"),
    # open()'s default since issue 28's seventeenth slice, background="auto": a persist process
    # from the first commit_async (the rows above without it, "(default)" among them, run on
    # the persist thread, the default before)
    "commit_async, lossless, background='auto' (the default)": (
        EncodingOptions(), Policy(), "auto"),
    # before the persist process joined training's session (a session of its own: Linux
    # shares the CPU between sessions first)
    "commit_async, lossless, background='auto', a session of its own (before)": (
        EncodingOptions(), Policy(), "auto", "own session"),
    # before batched durability: each chunk file and folder of a commit fsynced
    # (CKPTSTORE_DURABILITY=file, which the persist process inherits)
    "commit_async, lossless, background='auto', each file fsynced (before)": (
        EncodingOptions(), Policy(), "auto", "each file fsynced"),
}


@contextmanager
def encoded_in_steps(on: bool) -> Iterator[None]:
    """Quantized chunks encoded a kernel call a step, as before the one-call encoder (issue
    28): ``Quantize.encode_one_call`` declines, RLEHuffman runs its steps."""
    if not on:
        yield
        return
    one_call, coder = Quantize.encode_one_call, rle_huffman._ONE_CALL
    Quantize.encode_one_call = lambda self, buf, **kw: None
    rle_huffman._ONE_CALL = None
    try:
        yield
    finally:
        Quantize.encode_one_call, rle_huffman._ONE_CALL = one_call, coder


@contextmanager
def native_switch(setter: str, value: object, on: bool) -> Iterator[None]:
    """``ckptcodecs._native.<setter>(value)`` while on (a setter that returns its previous
    setting), as before a change of issue 28: ``adaptive_early_end(False)``, the adaptive
    search's greedy walks taken to their end (the same ranges); ``nogil_min(0)``, every compiled
    kernel call releasing the GIL."""
    if not on:
        yield
        return
    set_ = getattr(_backend.native(), setter)
    before = set_(value)
    try:
        yield
    finally:
        set_(before)


@contextmanager
def huffman_below(share: float | None) -> Iterator[None]:
    """BytePlanes' Huffman threshold at ``share`` (``planes.HUFFMAN_BELOW``), where not None."""
    if share is None:
        yield
        return
    before, planes.HUFFMAN_BELOW = planes.HUFFMAN_BELOW, share
    try:
        yield
    finally:
        planes.HUFFMAN_BELOW = before


#: the issue's yardstick: each tensor copied into a preallocated buffer on the loop's thread
#: (the stall a snapshot cannot avoid), nothing persisted
BARE = "bare copy into preallocated buffers"


class Busy:
    """``n`` CPU-bound processes at normal priority, stopped and continued as a group."""

    def __init__(self, n: int):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                      for _ in range(n)]

    def signal(self, sig: int) -> None:
        for p in self.procs:
            p.send_signal(sig)

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


class Run(NamedTuple):
    """One timed loop: steps per second, commits, whether the watchdog fired, persists that ran
    raised, and the loop thread's sleeps: seconds it was neither running nor waiting for a core
    (waiting for the GIL, or for a persist), and how many times it went to sleep."""

    rate: float
    commits: int
    froze: bool
    starved: int
    slept: float
    sleeps: int
    server: float = 0.0  # --remote s3: the S3 server's CPU seconds over the loop


def thread_clock() -> tuple[float, float, int]:
    """This thread's seconds on a core and seconds waited runnable (``schedstat``), and its
    voluntary context switches (``status``); zeros where /proc has no such files."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            run_ns, wait_ns = map(int, f.read().split()[:2])
        with open("/proc/thread-self/status") as f:
            switches = next(int(line.split()[1]) for line in f
                            if line.startswith("voluntary_ctxt_switches"))
    except (OSError, StopIteration, ValueError):
        return 0.0, 0.0, 0
    return run_ns / 1e9, wait_ns / 1e9, switches


class Remote:
    """A moto S3 server in a process of its own, at normal priority (a stand-in for a remote
    store: the HTTP client's work stays in the store's processes, the server's is not theirs),
    and the s3fs options that reach it. Each run's store is a prefix of one bucket, removed
    after the run (moto holds objects in memory)."""

    BUCKET = "cpu-proxy"

    def __init__(self, nice: int = 0) -> None:
        here = os.path.dirname(os.path.abspath(__file__))
        code = ("import json, logging, sys; sys.path.insert(0, %r); "
                "logging.getLogger('werkzeug').setLevel(logging.ERROR); "
                "from reliability import start_moto; server, options = start_moto(%r); "
                "print(json.dumps(options), flush=True); sys.stdin.read(); server.stop()"
                % (here, self.BUCKET))
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True,
                                     preexec_fn=(lambda: os.nice(nice)) if nice else None)
        try:
            self.options = json.loads(self.proc.stdout.readline())
        except BaseException:  # the server did not start: no process left behind
            self.proc.kill()
            self.proc.wait()
            raise

    def url(self, folder: str) -> str:
        return f"s3://{self.BUCKET}/{os.path.basename(folder)}"

    def remove(self, folder: str) -> None:
        import s3fs

        s3fs.S3FileSystem(**self.options, skip_instance_cache=True).rm(
            f"{self.BUCKET}/{os.path.basename(folder)}", recursive=True)

    def cpu(self) -> float:
        """The server's CPU seconds so far."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


#: ``--remote s3``: the stores of a run are on this server, not in a local folder
REMOTE: Remote | None = None
#: ``--remote tiered``/``tiered-s3``: each store a tiered one, its local tier in the run's folder
TIERED = False

#: benchmark-only priorities: SCHED_IDLE never raised (before issue 26); nice +19 for "low"
VARIANTS = {"idle-old": "idle", "low-19": "low"}
LOW_NICE = ckptstore.priority.LOW_NICE


def open_store(folder: str, options: EncodingOptions, policy: Policy, io_workers: int | None,
               priority: str, cached: bool = False, background: str = "thread"
               ) -> ckptstore.Store:
    """A store at ``priority`` (or one of :data:`VARIANTS`); ``cached``: chunk files written
    through the page cache, as before O_DIRECT; ``background``: open's."""
    ckptstore.priority.LOW_NICE = 19 if priority == "low-19" else LOW_NICE
    where = (folder, {}) if REMOTE is None else (REMOTE.url(folder), REMOTE.options)
    tier = {"local": os.path.join(folder, "local")} if TIERED else {}
    if TIERED and REMOTE is None:
        where = (os.path.join(folder, "remote"), {})
    store = ckptstore.open(where[0], options=options, policy=policy, io_workers=io_workers,
                           background_priority=VARIANTS.get(priority, priority),
                           background=background, **tier, **where[1])
    if priority == "idle-old":
        store._committer.background.boosted = nullcontext
    if REMOTE is None and not TIERED:
        store.storage.direct_writes = not cached
    return store


def _marked(config: tuple | str | None, mark: str) -> bool:
    """Whether a configuration's tuple carries ``mark`` after its options and policy."""
    return isinstance(config, tuple) and mark in config[2:]


def _stepwise(config: tuple | str | None) -> bool:
    return _marked(config, "steps")


def _cached(config: tuple | str | None) -> bool:
    return _marked(config, "cached")


def _whole_walk(config: tuple | str | None) -> bool:
    return _marked(config, "whole walk")


def _background(config: tuple | str | None) -> str:
    return next((way for way in ("process", "auto") if _marked(config, way)), "thread")


@contextmanager
def own_session(on: bool) -> Iterator[None]:
    """Persist processes started in a session of their own, as before issue 28's seventeenth
    slice (``child.OWN_GROUP``)."""
    if not on:
        yield
        return
    before, child.OWN_GROUP = child.OWN_GROUP, {"start_new_session": True}
    try:
        yield
    finally:
        child.OWN_GROUP = before


@contextmanager
def each_file_fsynced(on: bool) -> Iterator[None]:
    """Durable stores opened meanwhile fsync each chunk file and folder (the persist process
    they start inherits the environment), as before batched durability (issue 28)."""
    if not on:
        yield
        return
    before = os.environ.get(DURABILITY_ENV)
    os.environ[DURABILITY_ENV] = "file"
    try:
        yield
    finally:
        if before is None:
            del os.environ[DURABILITY_ENV]
        else:
            os.environ[DURABILITY_ENV] = before


def _every_call(config: tuple | str | None) -> bool:
    return _marked(config, "every call")


def _huffman_below(config: tuple | str | None) -> float | None:
    return 0.985 if _marked(config, "huffman 0.985") else None


def run(config: tuple | None, state: dict, seconds: float, interval: float, root: str,
        io_workers: int | None = None, priority: str = "low", busy: Busy | None = None
        ) -> Run:
    """:func:`run_loop`, quantized chunks encoded in steps, chunk files written through the
    page cache, the adaptive search's walks taken to their end, BytePlanes' Huffman threshold
    as before, or every kernel call releasing the GIL, for a configuration that says so."""
    with (encoded_in_steps(_stepwise(config)),
          native_switch("adaptive_early_end", False, _whole_walk(config)),
          native_switch("nogil_min", 0, _every_call(config)),
          huffman_below(_huffman_below(config)),
          own_session(_marked(config, "own session")),
          each_file_fsynced(_marked(config, "each file fsynced"))):
        return run_loop(config[:2] if isinstance(config, tuple) else config, state, seconds,
                        interval, root, io_workers, priority, busy, _cached(config),
                        _background(config))


def run_loop(config: tuple | None, state: dict, seconds: float, interval: float, root: str,
             io_workers: int | None = None, priority: str = "low", busy: Busy | None = None,
             cached: bool = False, background: str = "thread") -> Run:
    """Steps per second of the loop, the commits it made, whether the watchdog stopped the busy
    processes (``busy`` runs only during the timed loop), how many persists ran at normal
    priority because they were starved (a persist process's own included)."""
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(32, 32, generator=g), torch.randn(32, 32, generator=g) * 0.1
    store = None
    folder = tempfile.mkdtemp(dir=root)
    tensors = [t for t in state.values() if isinstance(t, torch.Tensor)]
    buffers = [torch.empty_like(t) for t in tensors] if config == BARE else []
    if config is not None and config != BARE:
        options, policy = config
        store = open_store(folder, options, policy, io_workers, priority, cached, background)
        if background == "auto":  # the persist process running before the timed loop
            store.reserve(state).result()
        store.commit_async(state).wait()  # warm: staging buffers, compiled kernels
        if store.tiers is not None:  # uploaded (an upload process running) before the loop
            store.push()
    fired = threading.Event()

    def watchdog() -> None:
        fired.set()
        busy.signal(signal.SIGSTOP)

    guard = threading.Timer(3 * seconds, watchdog) if busy else None
    if busy:
        busy.signal(signal.SIGCONT)
        guard.start()
    steps, commits = 0, 0
    server = REMOTE.cpu() if REMOTE is not None else 0.0
    before = thread_clock()
    t0 = last = time.perf_counter()
    while True:
        for _ in range(6):  # 24 small ops
            x = torch.tanh(x @ w)
            x = x * 0.5 + 0.1
            x = x.clamp(-1, 1)
        steps += 1
        now = time.perf_counter()
        if config is not None and now - last >= interval:
            if store is not None:
                store.commit_async(state)
            for buf, t in zip(buffers, tensors):
                buf.copy_(t)
            commits += 1
            last = now
        if now - t0 >= seconds:
            break
    wall = time.perf_counter() - t0
    after = thread_clock()
    server = REMOTE.cpu() - server if REMOTE is not None else 0.0
    rate = steps / wall
    slept = wall - (after[0] - before[0]) - (after[1] - before[1])
    if busy:
        guard.cancel()
        busy.signal(signal.SIGSTOP)
    starved = 0
    if store is not None:
        committer = store._committer
        # a persist process's own count (it answers once the persist in flight ended)
        own = (committer.call_stats().get("starved", 0)
               if isinstance(committer, process.ProcessCommitter) else 0)
        store.close()  # waits for the last persist (not timed)
        starved = committer.background.starved_persists + own
    shutil.rmtree(folder, ignore_errors=True)  # ~1 GB a run: the disk would fill
    if REMOTE is not None and store is not None:
        REMOTE.remove(folder)
    return Run(rate, commits, fired.is_set(), starved, slept, after[2] - before[2], server)


def gil_hold(config: tuple, state: dict, root: str, priority: str = "low"
             ) -> tuple[float, int, float]:
    """One persist of ``state`` while this thread spins: its wall seconds, and the number and
    total seconds of this thread's pauses longer than 0.2 ms."""
    options, policy = config[:2]
    folder = tempfile.mkdtemp(dir=root)
    try:
        with (encoded_in_steps(_stepwise(config)),
              native_switch("adaptive_early_end", False, _whole_walk(config))):
            return _gil_hold(open_store(folder, options, policy, None, priority,
                                        _cached(config)), state, folder)
    finally:
        if REMOTE is not None:
            REMOTE.remove(folder)


def _gil_hold(store: ckptstore.Store, state: dict, folder: str) -> tuple[float, int, float]:
    store.commit_async(state).wait()  # warm
    pending = store.commit_async(state)
    t0 = last = time.perf_counter()
    pauses: list[float] = []
    while not pending.done():
        now = time.perf_counter()
        if now - last > 2e-4:
            pauses.append(now - last)
        last = now
    wall = time.perf_counter() - t0
    store.close()
    shutil.rmtree(folder, ignore_errors=True)
    return wall, len(pauses), sum(pauses)


def gil_table(state: dict, repeat: int) -> list[list[str]]:
    root = tempfile.mkdtemp(prefix="cpu-proxy-")
    rows = []
    try:
        runs = {name: [gil_hold(c, state, root) for _ in range(repeat)]
                for name, c in CONFIGS.items() if c}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for name, r in runs.items():
        rows.append([name, f"{1e3 * statistics.median(x[0] for x in r):.0f}",
                     f"{statistics.median(x[1] for x in r):.0f}",
                     f"{1e3 * statistics.median(x[2] for x in r):.0f}"])
    return rows


def minilm_state(steps: int = 5) -> dict:
    """MiniLM's float weights and its AdamW moments after ``steps`` steps of lossless.py's
    fine-tune, as one state of tensors (about 271 MB) and a step counter."""
    from lossless import finetune

    versions, moments = finetune(2, steps)
    state: dict = {f"model.{k}": torch.from_numpy(v) for k, v in versions[-1].items()}
    state |= {f"optim.{i}": torch.from_numpy(m) for i, m in enumerate(moments)}
    state["step"] = steps
    return state


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=256, help="state size in MB")
    ap.add_argument("--seconds", type=float, default=8.0, help="timed loop per run")
    ap.add_argument("--interval", type=float, default=1.3, help="seconds between commits")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--io-workers", type=int, nargs="+", default=[0],
                    help="store worker threads to compare (0: the store's default)")
    ap.add_argument("--priority", nargs="+", default=["low"],
                    choices=["low", "idle", "normal", *VARIANTS],
                    help="background_priority values to compare (default: the store's default; "
                         "idle-old: SCHED_IDLE without priority inheritance, before issue 26; "
                         "low-19: low at nice +19)")
    ap.add_argument("--busy", type=int, nargs="+", default=[0],
                    help="CPU-bound processes beside the loop, each count compared")
    ap.add_argument("--only", nargs="+", default=None,
                    help="run only the checkpoint configurations whose names contain one of these")
    ap.add_argument("--gil", action="store_true",
                    help="measure what one persist takes from a thread that wants the GIL")
    ap.add_argument("--state", choices=["synthetic", "minilm"], default="synthetic",
                    help="synthetic: --size MB of async_writer.py's normal_ floats; minilm: "
                         "MiniLM's weights and AdamW moments after a short fine-tune (271 MB, "
                         "a real training state; --size ignored)")
    ap.add_argument("--remote", choices=["local", "s3", "tiered", "tiered-s3"], default="local",
                    help="s3: every store on a moto S3 server in a process of its own; tiered: "
                         "a tiered store, its remote a local folder (tiered-s3: on that server)")
    ap.add_argument("--server-nice", type=int, default=0,
                    help="--remote s3: the server's nice value (19: it runs mostly on what the "
                         "loop and the persist leave, closer to a server on another machine)")
    args = ap.parse_args(argv)
    print(f"# {command_line(__file__, argv)}\n# {machine_description()}\n"
          f"# load average before: {_load()}\n")
    global REMOTE, TIERED
    REMOTE = Remote(args.server_nice) if args.remote in ("s3", "tiered-s3") else None
    TIERED = args.remote.startswith("tiered")
    try:
        return _main(args)
    finally:
        if REMOTE is not None:
            REMOTE.close()


def _main(args: argparse.Namespace) -> int:
    state = build_state(args.size << 20) if args.state == "synthetic" else minilm_state()
    if args.gil:
        print(markdown_table(["configuration", "persist ms", "pauses > 0.2 ms", "paused ms"],
                             gil_table(state, args.repeat), "lrrr"))
        return 0
    configs = {"no checkpoint": (None, None, "low"), BARE: (BARE, None, "low")}
    for workers in args.io_workers:
        for priority in args.priority:
            suffix = "" if len(args.io_workers) == 1 else (
                ", default workers" if not workers else f", {workers} worker(s)")
            suffix += "" if len(args.priority) == 1 else f", {priority} priority"
            configs |= {name + suffix: (c, workers or None, priority)
                        for name, c in CONFIGS.items()
                        if c and (not args.only or any(o in name for o in args.only))}
    rows = []
    for n in args.busy:
        rows += busy_rows(n, configs, state, args)
    server = ["S3 server CPU-s a commit"] if REMOTE is not None else []
    print(markdown_table(["busy processes", "configuration", "steps/s", "slowdown",
                          "step time / bare copy's (paired)", "loop slept ms a commit",
                          "loop sleeps a commit", "commits", "starved persists", "froze",
                          *server], rows, "rlrrrrrrrr" + "r" * len(server)))
    print(f"\n# load average after: {_load()}")
    return 0


def busy_rows(n: int, configs: dict, state: dict, args: argparse.Namespace) -> list[list[str]]:
    """Every configuration ``args.repeat`` times (interleaved) beside ``n`` busy processes."""
    root = tempfile.mkdtemp(prefix="cpu-proxy-")
    busy = Busy(n) if n else None
    if busy:
        busy.signal(signal.SIGSTOP)
    runs: dict[str, list[Run]] = {k: [] for k in configs}
    try:
        for r in range(args.repeat):
            for name, (config, workers, priority) in (configs.items() if r % 2 == 0
                                                      else reversed(list(configs.items()))):
                out = run(config, state, args.seconds, args.interval, root, workers, priority,
                          busy)
                runs[name].append(out)
                print(f"busy {n}, round {r + 1}: {name}: {out.rate:.0f} steps/s, {out.commits} "
                      f"commits, {out.starved} starved{', froze' if out.froze else ''}, slept "
                      f"{1e3 * out.slept:.0f} ms in {out.sleeps}"
                      + (f", S3 server {out.server:.2f} CPU-s" if REMOTE is not None else ""),
                      file=sys.stderr, flush=True)
    finally:
        if busy:
            busy.close()
        shutil.rmtree(root, ignore_errors=True)
    base = statistics.median(x[0] for x in runs["no checkpoint"])
    rows = []
    for name, v in runs.items():
        rate = statistics.median(x[0] for x in v)
        # the time a step takes against the bare copy's in the same round (runs drift by 10 %
        # and more over a benchmark on a VM; a round's runs are next to each other)
        paired = statistics.median(b[0] / x[0] for b, x in zip(runs[BARE], v))
        per_commit = [(x.slept / x.commits, x.sleeps / x.commits) for x in v if x.commits]
        rows.append([str(n), name, f"{rate:.0f}",
                     "–" if name == "no checkpoint" else f"{100 * (1 - rate / base):+.1f} %",
                     "–" if name in ("no checkpoint", BARE) else f"{paired:.2f}x",
                     f"{1e3 * statistics.median(s for s, _ in per_commit):.0f}"
                     if per_commit else "–",
                     f"{statistics.median(k for _, k in per_commit):.0f}" if per_commit else "–",
                     f"{statistics.median(x[1] for x in v):.0f}",
                     f"{sum(x[3] for x in v)}", f"{sum(x[2] for x in v)}/{len(v)}"])
        if REMOTE is not None:
            rows[-1].append(f"{statistics.median(x.server / x.commits for x in v if x.commits):.2f}"
                            if per_commit else "–")
    return rows


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


if __name__ == "__main__":
    raise SystemExit(main())
