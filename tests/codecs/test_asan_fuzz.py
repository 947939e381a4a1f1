"""The fuzz targets and safety tests of the compiled kernels pass under AddressSanitizer and
UndefinedBehaviorSanitizer (issue 28): a short run of ``tests/codecs/asan_fuzz.py``, the
campaign ``make fuzz`` runs with a larger budget."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import asan_fuzz

HERE = Path(__file__).parent


@pytest.mark.skipif(asan_fuzz.runtime() is None,
                    reason="no C compiler with AddressSanitizer's runtime (libasan) here")
def test_kernels_run_clean_under_the_sanitizers(tmp_path):
    files = [str(HERE / "test_native_fuzz.py"), str(HERE / "test_native_safety.py")]
    run = subprocess.run([sys.executable, str(HERE / "asan_fuzz.py"), "--examples", "15",
                          "--files", *files], capture_output=True, text=True, timeout=600)
    report = run.stdout[-4000:] + run.stderr[-4000:]
    assert run.returncode == 0, report
    assert "sanitized build" in run.stdout and " passed" in run.stdout, report
    assert "ERROR: AddressSanitizer" not in report and "runtime error" not in report, report
