"""benchmarks/revisions.py: the library of a revision materialised, and the proof of what each
process (worker and ranks) imported."""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
# benchmarks/common.py, not tests/codecs/common.py (on pytest's pythonpath), is what revisions uses
_theirs = sys.modules.pop("common", None)
import revisions  # noqa: E402

sys.modules.pop("common", None)  # revisions keeps its own; the codec tests import theirs
if _theirs is not None:
    sys.modules["common"] = _theirs


def _tracked(rev: str) -> set[str]:
    out = subprocess.run(["git", "-C", str(BENCH.parent), "ls-tree", "-r", "--name-only", rev,
                          "ckptstore", "codecs", "setup.py", "pyproject.toml"], check=True,
                         capture_output=True, text=True)
    return set(out.stdout.split())


def _files(folder: str) -> set[str]:
    return {str(p.relative_to(folder)) for p in pathlib.Path(folder).rglob("*") if p.is_file()}


def test_one_revision_materialises_twice_with_every_package(tmp_path: pathlib.Path) -> None:
    """Base and head may name the same commit (a smoke run); each gets its own copy, nested
    packages included, and the build files of its C extensions (not built here: see below)."""
    a, b = (revisions.materialise("HEAD", str(tmp_path), build=False) for _ in range(2))
    assert a.source != b.source
    for rev in (a, b):
        assert _files(rev.source) == _tracked("HEAD")
        assert os.path.isfile(os.path.join(rev.path, "ckptstore", "dcp", "__init__.py"))
        assert os.path.isfile(os.path.join(rev.path, "ckptcodecs", "__init__.py"))


@pytest.mark.slow
def test_a_revision_with_compiled_kernels_runs_them(tmp_path: pathlib.Path) -> None:
    """A revision's extensions are built in its archive (about a minute), objects outside it,
    and a process importing the revision runs its C kernels, not numba's."""
    rev = revisions.materialise("HEAD", str(tmp_path))
    built = _files(rev.source) - _tracked("HEAD")
    assert built and all(f.endswith(".so") for f in built)
    env = dict(os.environ, PYTHONPATH=rev.path)
    out = subprocess.run([sys.executable, "-c", "from ckptcodecs import _backend as b; "
                          "print(b.CHOICE, b.native().__file__)"], env=env, cwd=str(tmp_path),
                         check=True, capture_output=True, text=True).stdout.split()
    assert out[0] == "c" and os.path.realpath(out[1]).startswith(os.path.realpath(rev.source))


def test_the_import_check_covers_every_process(tmp_path: pathlib.Path) -> None:
    rev = revisions.materialise("HEAD", str(tmp_path), build=False)
    mine = [os.path.join(rev.source, "ckptstore", "dcp", "writer.py"),
            os.path.join(rev.source, "codecs", "_floats.py")]
    revisions.check_imported(rev, [mine, mine, mine])
    other = os.path.join(str(BENCH.parent), "ckptstore", "store.py")
    with pytest.raises(SystemExit, match="rank 1 imported .*store.py"):
        revisions.check_imported(rev, [mine, mine, [*mine, other]])
    with pytest.raises(SystemExit, match="rank 0 imported no ckptcodecs"):
        revisions.check_imported(rev, [mine, mine[:1], mine])


@pytest.mark.slow
def test_the_sharded_case_runs_on_two_ranks() -> None:
    """The sharded case, tiny, against the installed library: both times, and each rank's
    library files."""
    args = argparse.Namespace(repeat=1, scale=0.01, quick=True)
    got = revisions._worker("sharded", args)
    assert set(got["results"]) == {"sharded commit, 2 ranks (s)", "resharded load, 2 ranks (s)"}
    assert len(got["imported"]) == 3
    assert all(any(f.endswith(os.path.join("dcp", "writer.py")) for f in files)
               for files in got["imported"][1:])


def test_the_kernels_case_times_each_kernel_in_and_past_the_cache() -> None:
    """The case ``kernels`` against this tree: a CPU time for each kernel, plane size and chunk
    dtype, every one measured (positive)."""
    got = revisions._kernels_cpu(argparse.Namespace(repeat=1))
    sizes = {key.split(", ")[-1] for key in got if key.startswith("huffman_encode")}
    assert sizes == {"2 MB (ms)", "32 MB (ms)"}
    assert sum(key.startswith("planes_encode") for key in got) == 3
    assert len(got) == 13 and all(value > 0 for value in got.values())
