"""A tiered store's upload process with a kill point (fault injection for tests/tiers and the
tier-kills campaign of benchmarks/reliability.py): ``arm_uploads`` in the store's process makes
its upload processes run this module, which SIGKILLs the store's process and then itself at the
``k``-th call of a remote storage method -- the job killed at that point of an upload, as when
the uploads ran on the store's own thread. ``arm_calls`` is the hook itself, which the kill
campaigns also install in their own processes."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

ARM = "CKPT_UPLOAD_KILL"  # the environment variable: [method, k, after, prefix]


def arm_uploads(method: str, k: int, after: bool = False, prefix: str = "") -> None:
    """In the store's process, before it opens the store: its upload processes run this module
    and die (with the store's process) at the ``k``-th ``FsspecStorage.<method>`` on a key
    starting with ``prefix``, before the call or ``after`` it."""
    from ckptstore.tiers import offload

    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (here, os.environ.get("PYTHONPATH")) if p)
    os.environ[ARM] = json.dumps([method, k, after, prefix])
    offload.UPLOAD_MODULE = "upload_kill_child"


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


if __name__ == "__main__":
    from ckptstore.storage import FsspecStorage

    method, k, after, prefix = json.loads(os.environ[ARM])
    arm_calls(FsspecStorage, method, k, after, prefix, _kill_both)
    from ckptstore.tiers.upload_worker import main

    sys.exit(main(sys.argv[1:]))
