"""The compiled kernels under AddressSanitizer and UndefinedBehaviorSanitizer (issue 28).

Usage (``make fuzz`` runs the first)::

    python tests/codecs/asan_fuzz.py --examples 2000          # every test_native_*.py file
    python tests/codecs/asan_fuzz.py --examples 20 --files tests/codecs/test_native_fuzz.py

Builds ``ckptcodecs._native`` from ``codecs/csrc`` with ``-fsanitize=address,undefined`` into a
temporary copy of the package, then runs the compiled kernels' test files against that build
(``LD_PRELOAD`` of the compiler's libasan, as CPython itself is not instrumented): the fuzz
targets of ``test_native_fuzz.py`` with ``--examples`` examples each (the fixed budget), the
twin and safety tests with their own. A read or write out of bounds, a use after free or an
undefined operation (overflow of a signed integer, a shift too wide) aborts the run with the
sanitizer's report and a non-zero exit code. Needs gcc (or ``CC``) with libasan.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ["-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer", "-std=c11",
         "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
         "-Wall", "-Wextra", "-Wno-unused-parameter"]


def compiler() -> str:
    return os.environ.get("CC", "gcc")


def runtime() -> str | None:
    """The compiler's libasan, to preload into the uninstrumented Python; None without one."""
    try:
        path = subprocess.run([compiler(), "-print-file-name=libasan.so"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return path if os.path.isabs(path) and os.path.exists(path) else None


def build(into: Path) -> Path:
    """A copy of the ckptcodecs package in ``into`` whose ``_native`` is the sanitized build."""
    package = into / "ckptcodecs"
    shutil.copytree(ROOT / "codecs", package,
                    ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.nbi", "*.nbc"))
    target = package / ("_native" + sysconfig.get_config_var("EXT_SUFFIX"))
    sources = sorted(glob.glob(str(package / "csrc" / "*.c")))
    subprocess.run([compiler(), *FLAGS, "-I", sysconfig.get_paths()["include"], *sources,
                    "-o", str(target)], check=True)
    if b"__asan_init" not in target.read_bytes():  # instrumented, or the run proves nothing
        raise RuntimeError(f"{target} was built without AddressSanitizer")
    return target


def environment(into: Path, asan: str, examples: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(into), str(ROOT / "tests" / "codecs")]),
        LD_PRELOAD=asan,
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1",
        UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
        CKPTCODECS_KERNELS="c",
        CKPTCODECS_FUZZ_EXAMPLES=str(examples),
    )
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=2000,
                        help="hypothesis examples per fuzz target (default 2000)")
    parser.add_argument("--files", nargs="*", default=None,
                        help="test files to run (default: tests/codecs/test_native_*.py)")
    args = parser.parse_args(argv)
    asan = runtime()
    if asan is None:
        print(f"{compiler()} has no libasan: cannot build the sanitized kernels", file=sys.stderr)
        return 2
    files = args.files or sorted(glob.glob(str(ROOT / "tests" / "codecs" / "test_native_*.py")))
    with tempfile.TemporaryDirectory(prefix="ckptcodecs-asan-") as tmp:
        target = build(Path(tmp))
        env = environment(Path(tmp), asan, args.examples)
        where = subprocess.run([sys.executable, "-c",
                                "import ckptcodecs._native as n; print(n.__file__)"],
                               env=env, capture_output=True, text=True, check=True).stdout.strip()
        if Path(where) != target:  # the tests must load the sanitized build, not the installed one
            print(f"loaded {where}, not the sanitized {target}", file=sys.stderr)
            return 2
        print(f"sanitized build: {target.name}; {args.examples} examples per fuzz target",
              flush=True)
        # the CPU-path fixture as a plugin (it imports only ckptcodecs); no conftest files:
        # tests/conftest.py imports torch, ckptstore and the S3 server
        return subprocess.run([sys.executable, "-m", "pytest", "--noconftest", "-q",
                               "-p", "simd_paths", "-p", "no:cacheprovider", "-p", "no:xdist",
                               "-x", *files],
                              env=env, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
