"""A child process for tests/tiers: commits to a tiered store and is SIGKILLed at its N-th
remote chunk write (by its upload process, which dies with it: benchmarks/upload_child.py).

    python tier_child.py LOCAL REMOTE_URL OPTIONS_JSON COMMITS KILL_AT

Prints ``committed <id>`` (flushed) after each commit returns.
"""

from __future__ import annotations

import json
import os
import sys

import torch

import ckptstore

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "benchmarks"))
from upload_child import arm_uploads  # noqa: E402


def arm(kill_at: int) -> None:
    """The job killed at the remote's ``kill_at``-th chunk write (in its upload process)."""
    arm_uploads("put_chunk", kill_at)


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
