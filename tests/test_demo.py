"""The demo that `make demo` runs: a short run must resume bit-exactly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo.py"


def test_demo_resumes_identically(tmp_path):
    out = subprocess.run([sys.executable, str(DEMO), "--store", str(tmp_path / "s"), "--steps",
                          "60", "--every", "20", "--crash-at", "35"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "IDENTICAL" in out.stdout and "verify: ok" in out.stdout
