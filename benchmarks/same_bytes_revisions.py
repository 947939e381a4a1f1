"""The refactoring guard: do two revisions write the same bytes for the same commits?

Usage::

    .venv/bin/python benchmarks/same_bytes_revisions.py --base 9f87563  # base vs working tree
    .venv/bin/python benchmarks/same_bytes_revisions.py --base 9f87563 --head HEAD
    .venv/bin/python benchmarks/same_bytes_revisions.py --write 9f87563  # the expected bytes
    make same-bytes BASE=9f87563

Each revision's library is materialised as benchmarks/revisions.py does (``git archive`` of
``ckptstore/`` and ``codecs/`` into a temporary folder put first on ``PYTHONPATH``, its C
extensions built there; the working tree is used in place), and a fresh subprocess runs every
scenario of
``tests/compat/same_bytes.py`` (the working tree's: public API only) against it, printing which
files it imported -- one that imported another revision's code stops the run. The full
fingerprints (the sha256 of every chunk, the normalised manifests) are compared, so a difference
names the scenario, the commit, the array and its chunks, or the manifest entry. Exit status 1
when they differ.

``--write REV`` stores REV's condensed fingerprint (one hash per array and manifest entry) as the
expected bytes of ``tests/compat/test_same_bytes.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
COMPAT = os.path.join(ROOT, "tests", "compat")
EXPECTED = os.path.join(ROOT, "tests", "data", "same_bytes.json")
sys.path.insert(0, HERE)
sys.path.insert(0, COMPAT)
from common import command_line  # noqa: E402
from revisions import Revision, materialise  # noqa: E402


def _worker(out: str, scenarios: str | None) -> None:
    import ckptcodecs
    import ckptstore
    import same_bytes

    print(json.dumps({"imported": [os.path.realpath(ckptstore.__file__),
                                   os.path.realpath(ckptcodecs.__file__)]}), flush=True)
    names = scenarios.split(",") if scenarios else None
    with open(out, "w") as f:
        json.dump(same_bytes.fingerprint(names), f)


def fingerprint_of(rev: Revision, tmp: str, scenarios: str | None) -> dict:
    """The full fingerprint of revision ``rev``'s library, made in a fresh subprocess."""
    out = os.path.join(tmp, f"fp-{abs(hash(rev.path))}.json")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([rev.path, COMPAT, HERE]))
    argv = [sys.executable, os.path.abspath(__file__), "--worker", out]
    if scenarios:
        argv += ["--scenarios", scenarios]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=HERE)
    if proc.returncode != 0:
        raise SystemExit(f"{rev.name} failed:\n{proc.stderr[-3000:]}")
    imported = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")][0]
    imported = imported["imported"]
    want = [os.path.realpath(os.path.join(rev.source, d)) for d in ("ckptstore", "codecs")]
    if not all(f.startswith(w + os.sep) for f, w in zip(imported, want)):
        raise SystemExit(f"{rev.name}: the subprocess imported {imported}, not {want}")
    with open(out) as f:
        return json.load(f)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default="HEAD", help="git revision to compare with (default HEAD)")
    p.add_argument("--head", default=None, help="git revision (default: the working tree)")
    p.add_argument("--scenarios", default=None, help="comma-separated (default: all)")
    p.add_argument("--write", metavar="REV", default=None,
                   help=f"write REV's condensed fingerprint to {os.path.relpath(EXPECTED, ROOT)}")
    p.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        _worker(args.worker, args.scenarios)
        return 0
    import same_bytes

    with tempfile.TemporaryDirectory(prefix="ckpt-same-bytes-") as tmp:
        if args.write:
            rev = materialise(args.write, tmp)
            fp = fingerprint_of(rev, tmp, args.scenarios)
            sha = subprocess.run(["git", "-C", ROOT, "rev-parse", f"{args.write}^{{commit}}"],
                                 check=True, capture_output=True, text=True).stdout.strip()
            command = command_line("benchmarks/same_bytes_revisions.py", argv)
            same_bytes.dump(fp, EXPECTED, {
                "revision": sha, "command": command,
                "regenerate": "only on purpose, when a format change is intended"})
            print(f"wrote {EXPECTED} from {rev.name}: {len(fp)} scenarios")
            return 0
        base, head = materialise(args.base, tmp), materialise(args.head, tmp)
        a, b = (fingerprint_of(r, tmp, args.scenarios) for r in (base, head))
    diffs = same_bytes.compare(a, b)
    commits = sum(len(v) for v in a.values())
    print(f"base = {base.name}, head = {head.name}: {len(a)} scenarios, {commits} commits, "
          f"{len(diffs)} differences")
    for line in diffs:
        print("  " + line)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
