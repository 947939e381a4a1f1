"""Small helpers shared by the benchmark scripts: timing, sizes, markdown tables, machine notes.

Nothing here knows about ckptstore; a benchmark script imports what it needs::

    from common import Timer, human_bytes, markdown_table, median_time
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = [
    "MB",
    "MiB",
    "Timer",
    "time_call",
    "median_time",
    "dir_bytes",
    "human_bytes",
    "fmt_ratio",
    "fmt_rate",
    "markdown_table",
    "machine_description",
    "load_average",
    "peak_rss_bytes",
    "write_text",
]

MB = 10**6
MiB = 2**20


class Timer:
    """Timer as a context manager: after exit ``.seconds`` is the wall time
    (``time.perf_counter``) and ``.cpu_seconds`` the CPU time of the whole process, all threads
    (``time.process_time``; less disturbed than wall time when other processes share the cores).

    >>> with Timer() as t:
    ...     pass
    >>> t.seconds >= 0 and t.cpu_seconds >= 0
    True
    """

    def __enter__(self) -> Timer:
        self.seconds = self.cpu_seconds = 0.0
        self._c0 = time.process_time()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.seconds = time.perf_counter() - self._t0
        self.cpu_seconds = time.process_time() - self._c0


def time_call(fn: Callable[[], Any], sync: bool = True) -> tuple[Timer, Any]:
    """Time one call of ``fn``: ``(timer, result)``, see :class:`Timer`.

    With ``sync=True`` ``os.sync()`` runs first (untimed), so dirty pages left by an earlier write
    are flushed before the clock starts and do not slow the measured operation down.
    """
    if sync and hasattr(os, "sync"):
        os.sync()
    with Timer() as t:
        result = fn()
    return t, result


def median_time(fn: Callable[[], Any], repeat: int = 3, sync: bool = True) -> float:
    """Median wall time of ``repeat`` calls of ``fn`` (see :func:`time_call`)."""
    return statistics.median(time_call(fn, sync)[0].seconds for _ in range(max(1, repeat)))


def best_time(fn: Callable[[], Any], repeat: int = 3,
              clock: Callable[[], float] = time.perf_counter) -> float:
    """The shortest of ``repeat`` calls of ``fn`` on ``clock``, after one untimed warm-up call
    (compiles, fills caches)."""
    fn()
    best = float("inf")
    for _ in range(max(1, repeat)):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def dir_bytes(path: str | os.PathLike) -> int:
    """Sum of the sizes of all files under ``path`` (recursive; a file's own size if a file)."""
    path = os.fspath(path)
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(d, f))
    return total


def human_bytes(n: float, binary: bool = False) -> str:
    """``257200000`` -> ``"257.2 MB"`` (``binary=True``: ``"245.3 MiB"``).

    >>> human_bytes(1536, binary=True)
    '1.5 KiB'
    >>> human_bytes(999)
    '999 B'
    """
    base, units = (1024.0, ("B", "KiB", "MiB", "GiB", "TiB")) if binary else \
        (1000.0, ("B", "kB", "MB", "GB", "TB"))
    x = float(n)
    for unit in units:
        if abs(x) < base or unit == units[-1]:
            return f"{int(x)} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= base
    raise AssertionError("unreachable")


def fmt_ratio(x: float | None, digits: int = 2) -> str:
    """``1.234`` -> ``"1.23×"``; ``None`` -> ``"–"``."""
    return "–" if x is None else f"{x:.{digits}f}×"


def fmt_rate(nbytes: float, seconds: float) -> str:
    """Throughput in MB/s (10^6 bytes per second), no decimals above 100."""
    rate = nbytes / seconds / MB if seconds > 0 else float("inf")
    return f"{rate:.0f}" if rate >= 100 else f"{rate:.1f}"


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]],
                   align: str | None = None) -> str:
    """A GitHub markdown table; ``align`` is one letter per column, ``l`` or ``r`` (default:
    first column left, the others right).

    >>> print(markdown_table(["a", "b"], [["x", 1]]))
    | a | b |
    |:--|--:|
    | x | 1 |
    """
    header = [str(h) for h in header]
    align = align or "l" + "r" * (len(header) - 1)
    if len(align) != len(header):
        raise ValueError(f"align has {len(align)} letters for {len(header)} columns")
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(":--" if a == "l" else "--:" for a in align) + "|"]
    for row in rows:
        cells = [str(c) for c in row]
        if len(cells) != len(header):
            raise ValueError(f"row {cells} has {len(cells)} cells for {len(header)} columns")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def load_average() -> str:
    """The 1-minute load average as text ("n/a" where the OS has none)."""
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except (AttributeError, OSError):
        return "n/a"


def machine_description() -> str:
    """One line: CPU count, architecture, OS, Python and (if importable) torch version."""
    parts = [f"{os.cpu_count()} CPUs", platform.machine(), platform.system(),
             f"Python {platform.python_version()}"]
    try:
        import torch
        parts.append(f"torch {torch.__version__} ({torch.get_num_threads()} threads)")
    except ImportError:
        pass
    return ", ".join(parts)


def peak_rss_bytes() -> int | None:
    """Peak resident set size of this process so far (None where ``resource`` is missing)."""
    try:
        import resource
    except ImportError:
        return None
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib if platform.system() == "Darwin" else kib * 1024


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (with a final newline) to ``path``, creating parent folders."""
    path = os.fspath(path)
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text if text.endswith("\n") else text + "\n")


def command_line(script: str, argv: Sequence[str] | None) -> str:
    """The shell command that ran ``script`` with ``argv`` (default ``sys.argv[1:]``)."""
    import shlex
    import sys

    args = argv if argv is not None else sys.argv[1:]
    return " ".join(["python", script, *(shlex.quote(a) for a in args)])


def spawn_ranks(target: Callable[..., None], world: int, args: tuple, root: str) -> dict:
    """Run ``target(rank, world, *args, root)`` on ``world`` spawned processes (gloo ranks
    initialise from ``root``); rank 0 leaves its result in ``<root>/result.json``."""
    import json
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    os.environ["LOCAL_WORLD_SIZE"] = str(world)  # the ranks share this host, as torchrun says
    procs = [ctx.Process(target=target, args=(r, world, *args, root)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise SystemExit(f"a rank failed: exit codes {[p.exitcode for p in procs]}")
    with open(os.path.join(root, "result.json")) as f:
        return json.load(f)
