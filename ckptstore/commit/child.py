"""A helper process of a store's own that answers frames (:mod:`.wire`) on two pipes: the persist
process (:mod:`.process`) and a tiered store's upload process (:mod:`ckptstore.tiers.offload`).

It runs ``python -c BOOT <module> <in fd> <out fd>``: the module's ``main`` (:func:`serve`) reads
a frame, answers it (``{"ok": ...}`` or ``{"error": ...}``, with any number of ``{"sent": n}``
progress frames before the answer), and ends at an ``end`` frame or when its pipe closes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from contextlib import nullcontext, suppress
from typing import Any

from ..priority import block_interrupts
from .wire import error_from_plain, error_to_plain, read_frame, write_frame

__all__ = ["BOOT", "Child", "exchange_thread", "serve"]

#: how a helper starts: ``python -c BOOT <module> <in fd> <out fd>``, without the working folder
#: (SIGTTOU ignored: in a background group, a write to a ``tostop`` terminal would stop it)
BOOT = ("import signal; signal.signal(signal.SIGTTOU, signal.SIG_IGN); "
        "import runpy, sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
        "sys.argv = sys.argv[1:]; runpy.run_module(sys.argv[0], run_name='__main__', "
        "alter_sys=True)")

#: a group of its own in training's session (3.11+), not a session: Linux shares the CPU between
#: sessions first (a persist in its own outlasted the interval: docs/benchmarks.md, 17th slice)
OWN_GROUP: dict[str, Any] = ({"process_group": 0} if sys.version_info >= (3, 11)
                            else {"start_new_session": True})


def exchange_thread() -> None:
    """A thread that exchanges with a helper: no Ctrl-C, and no SIGPIPE (a write to a helper
    that died raises ``BrokenPipeError`` there, whatever the training script set SIGPIPE to)."""
    block_interrupts()
    if hasattr(signal, "pthread_sigmask") and hasattr(signal, "SIGPIPE"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPIPE})


class Child:
    """A helper process running ``module`` and its two pipes; ``name`` (``"persist process"``)
    says what it is in errors. Exchanges run on one thread of the caller's, with SIGPIPE blocked
    there (a write to a process that died raises ``BrokenPipeError``)."""

    #: the error of a process that ended or answered nonsense, and what happens next
    failure: type[Exception] = ChildProcessError
    next_time = "a new one starts next time"

    def __init__(self, module: str, name: str):
        self.name = name
        to_child, self._to_child = os.pipe()
        self._from_child, from_child = os.pipe()
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        try:
            # the training script's folder off sys.path (python -m would put the working folder
            # first); a process group of its own, so that a terminal's Ctrl-C stops training,
            # not the helper's work in flight (it ends when its store closes it)
            self.proc = subprocess.Popen(
                [sys.executable, "-c", BOOT, module, str(to_child), str(from_child)],
                pass_fds=(to_child, from_child), env=env, stdin=subprocess.DEVNULL,
                **OWN_GROUP)
        except BaseException:
            os.close(self._to_child)
            os.close(self._from_child)
            raise
        finally:
            os.close(to_child)
            os.close(from_child)
        self.broken = False

    def call(self, message: dict[str, Any], progress: Callable[[int], None] | None = None
             ) -> Any:
        """Send ``message``, return the answer's ``"ok"``, raise what the process reported;
        ``progress(n)`` for each ``{"sent": n}`` frame before the answer."""
        try:
            write_frame(self._to_child, message)
            answer = read_frame(self._from_child)
            while isinstance(answer, dict) and "sent" in answer and len(answer) == 1:
                if progress is not None:
                    progress(int(answer["sent"]))
                answer = read_frame(self._from_child)
        except (EOFError, BrokenPipeError) as e:
            self.broken = True  # replaced at the next use, whatever poll() says yet
            try:
                code = self.proc.wait(5)
            except subprocess.TimeoutExpired:
                code = None
            raise self.failure(
                f"the {self.name} ended (exit status {code}) during {message.get('op')!r}: "
                f"its own output above says why; {self.next_time}") from e
        if not isinstance(answer, dict) or ("ok" not in answer and "error" not in answer):
            raise self.failure(f"the {self.name} answered {answer!r:.200}")
        if "error" in answer:
            raise error_from_plain(answer["error"], self.name)
        return answer["ok"]

    def alive(self) -> bool:
        return not self.broken and self.proc.poll() is None

    def close(self, timeout: float = 60.0) -> None:
        """Ask the process to end (after its work in flight), then reap it: in a frame, as a
        process forked from training since (a DataLoader worker) keeps a copy of the pipe."""
        if not self.broken and self.proc.poll() is None:
            # an OSError: it ended meanwhile (SIGPIPE is blocked on the exchange thread)
            with suppress(OSError):
                write_frame(self._to_child, {"op": "end"})
        for fd in (self._to_child, self._from_child):
            with suppress(OSError):
                os.close(fd)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def serve(source: int, sink: int, handle: Callable[[Any], Any],
          sending: threading.Lock | None = None) -> int:
    """The helper's side (its ``main``): answer each frame read on ``source`` with
    ``handle(message)``'s result (or the exception it raised) on ``sink``, holding ``sending``
    where other threads write progress frames there; 0 at an ``end`` frame (its store closed:
    a process forked from training since may still hold the pipe), at the pipe's end, or where
    the store's process ended."""
    while True:
        try:
            message = read_frame(source)
        except EOFError:
            return 0
        if isinstance(message, dict) and message.get("op") == "end":
            return 0
        try:
            answer = {"ok": handle(message)}
        except Exception as e:  # noqa: BLE001 - reported to the store, which raises it
            answer = {"error": error_to_plain(e)}
        try:
            with sending or nullcontext():
                write_frame(sink, answer)
        except BrokenPipeError:
            return 0
