"""The compiled kernels' plain loops, without the SSE2 transposes, match the numba twins too.

The default build does blocks of 16 items with vector code and only the rest with the plain
loops (what CPUs without SSE2 run for everything). Here the extension is built again with
``-DCKPTCODECS_PORTABLE`` (plain loops only) into a temporary folder, and a subprocess runs the
twin, hostile-size and BytePlanes tests against it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptcodecs import _backend

ROOT = Path(__file__).resolve().parents[2]
TESTS = ["test_native_twins.py", "test_native_safety.py", "test_codec_planes.py",
         "test_codec_planes_region.py"]
_RUN = """
import importlib.util, sys
import pytest
spec = importlib.util.spec_from_file_location("ckptcodecs._native", sys.argv[1])
native = importlib.util.module_from_spec(spec)
spec.loader.exec_module(native)
sys.modules["ckptcodecs._native"] = native  # before ckptcodecs imports the built one
import ckptcodecs._backend
assert ckptcodecs._backend.native() is native
sys.exit(pytest.main(sys.argv[2:]))
"""


@pytest.mark.skipif(_backend.native() is None, reason="ckptcodecs' compiled kernels are not built")
def test_plain_loops_match_the_reference(tmp_path):
    env = {**os.environ, "CFLAGS": "-DCKPTCODECS_PORTABLE", _backend.KERNELS_ENV: "c"}
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--force", "--build-lib",
                    str(tmp_path / "lib"), "--build-temp", str(tmp_path / "tmp")],
                   cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
    (built,) = (tmp_path / "lib" / "ckptcodecs").glob("_native*")
    run = subprocess.run(
        [sys.executable, "-c", _RUN, str(built), "-q", "-p", "no:cacheprovider", "-p",
         "no:xdist", *[str(Path(__file__).parent / name) for name in TESTS]],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "failed" not in run.stdout
