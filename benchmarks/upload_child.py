"""A tiered store's upload process with a fault injected (tests/tiers and the tier-kills campaign
of benchmarks/reliability.py). In the store's process, before it opens the store:

- ``arm_uploads``: its upload processes SIGKILL the store's process and then themselves at the
  ``k``-th call of a remote storage method -- the job killed at that point of an upload, as
  when the uploads ran on the store's own thread;
- ``slow_uploads``: every chunk the upload process writes takes ``seconds`` longer, and a line
  ``<monotonic time> <the writing thread's nice value>`` goes to ``log``.

``arm_calls`` is the hook itself, which the kill campaigns also install in their own processes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

ARM = "CKPT_UPLOAD_FAULT"  # the environment variable: {"kill": [...]} or {"slow": [...]}


def arm_uploads(method: str, k: int, after: bool = False, prefix: str = "") -> None:
    """The upload processes die (with the store's process) at the ``k``-th
    ``FsspecStorage.<method>`` on a key starting with ``prefix``, before the call or ``after``
    it."""
    _use({"kill": [method, k, after, prefix]})


def slow_uploads(seconds: float, log: str) -> None:
    """Each chunk an upload process writes (to a remote of any kind) waits ``seconds`` first
    and logs the writing thread's nice value."""
    _use({"slow": [seconds, log]})


def _use(fault: dict[str, Any]) -> None:
    from ckptstore.tiers import offload

    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (here, os.environ.get("PYTHONPATH")) if p)
    os.environ[ARM] = json.dumps(fault)
    offload.UPLOAD_MODULE = "upload_child"


def arm_calls(cls: type, name: str, k: int, after: bool, prefix: str,
              kill: Callable[[], None]) -> None:
    """``kill()`` at the ``k``-th call of ``cls.name`` (on a key starting with ``prefix``),
    before or ``after`` the call itself."""
    original, count = getattr(cls, name), [0]

    def hooked(self: Any, key: str, *args: Any, **kwargs: Any) -> Any:
        hit = str(key).startswith(prefix) and count[0] + 1 == k
        count[0] += str(key).startswith(prefix)
        if hit and not after:
            kill()
        out = original(self, key, *args, **kwargs)
        if hit:
            kill()
        return out

    setattr(cls, name, hooked)


def _kill_both() -> None:
    os.kill(os.getppid(), signal.SIGKILL)  # the store's process: the job dies here
    os.kill(os.getpid(), signal.SIGKILL)


def _slow(seconds: float, log: str) -> None:
    from ckptstore.storage import FsspecStorage, LocalStorage

    for cls in (FsspecStorage, LocalStorage):
        original = cls.put_chunk

        def put_chunk(self: Any, key: str, data: Any, original: Any = original) -> None:
            time.sleep(seconds)
            with open(log, "a") as f:
                f.write(f"{time.monotonic():.3f} {os.getpriority(os.PRIO_PROCESS, 0)}\n")
            original(self, key, data)

        cls.put_chunk = put_chunk


if __name__ == "__main__":
    from ckptstore.storage import FsspecStorage

    fault = json.loads(os.environ[ARM])
    if "kill" in fault:
        method, k, after, prefix = fault["kill"]
        arm_calls(FsspecStorage, method, k, after, prefix, _kill_both)
    else:
        _slow(*fault["slow"])
    from ckptstore.tiers.upload_worker import main

    sys.exit(main(sys.argv[1:]))
