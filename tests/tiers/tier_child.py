"""A child process for tests/tiers: commits to a tiered store and SIGKILLs itself at its N-th
remote write (the fault injection of tests/workers.py, on the remote's put_chunk only).

    python tier_child.py LOCAL REMOTE_URL OPTIONS_JSON COMMITS KILL_AT

Prints ``committed <id>`` (flushed) after each commit returns.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import torch

import ckptstore
from ckptstore.storage import FsspecStorage


def arm(kill_at: int) -> None:
    count = [0]
    original = FsspecStorage.put_chunk

    def put_chunk(self: FsspecStorage, key: str, data: Any) -> None:
        count[0] += 1
        if count[0] >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        original(self, key, data)

    FsspecStorage.put_chunk = put_chunk  # type: ignore[method-assign]


def main() -> None:
    local, remote, options, commits, kill_at = sys.argv[1:6]
    arm(int(kill_at))
    store = ckptstore.open(remote, local=local, **json.loads(options))
    g = torch.Generator().manual_seed(0)
    state = {f"w{i}": torch.randn(128, 128, generator=g) for i in range(6)}
    for step in range(int(commits)):
        for t in state.values():
            t.add_(1.0)
        info = store.commit(state, message=f"step {step}", metadata={"step": step})
        print(f"committed {info.id}", flush=True)
    store.push()
    print("pushed", flush=True)
    store.close()


if __name__ == "__main__":
    main()
