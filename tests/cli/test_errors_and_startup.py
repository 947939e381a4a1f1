"""``ckpt`` failing well and starting fast: one-line errors with documented exit statuses (also as
JSON), bounded waits on dead endpoints, Ctrl-C, progress only on a terminal, no torch for ``log``.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

import ckptstore
from ckptstore.cli import (EXIT_CORRUPT, EXIT_INTERRUPTED, EXIT_NOT_FOUND, EXIT_STORAGE,
                           EXIT_USAGE, main)
from ckptstore.layout import MARKER, manifest_key


@pytest.fixture
def small(tmp_path) -> str:
    """A local store with two commits (plain values only: no torch needed to write it)."""
    import numpy as np

    url = str(tmp_path / "small")
    with ckptstore.open(url) as store:
        for step in (1, 2):
            store.commit({"w": np.full(4, step, dtype=np.float32), "step": step},
                         message=f"step {step}", tags=["first"] if step == 1 else ())
    return url


def run(capsys, *argv: object) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_error_line(err: str) -> str:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def json_error(err: str) -> dict:
    doc = json.loads(one_error_line(err))
    assert set(doc) == {"error"} and set(doc["error"]) == {"type", "message", "exit_status"}
    return doc["error"]


# -- exit statuses ---------------------------------------------------------------------------------
def test_unknown_protocol_is_a_usage_error(capsys):
    rc, out, err = run(capsys, "log", "foo://x")
    assert rc == EXIT_USAGE == 2 and out == ""
    assert "unknown storage protocol 'foo'" in one_error_line(err)
    rc, out, err = run(capsys, "log", "foo://x", "--json")
    assert rc == 2 and out == ""
    assert json_error(err)["exit_status"] == 2


def test_not_found_exits_3_in_text_and_json(capsys, small, tmp_path):
    rc, out, err = run(capsys, "show", tmp_path / "nothing-here", "--json")
    assert rc == EXIT_NOT_FOUND == 3 and out == ""
    e = json_error(err)
    assert e["type"] == "NotAStoreError" and e["exit_status"] == 3
    assert "no ckptstore" in e["message"]
    assert not (tmp_path / "nothing-here").exists()
    for ref in ("nope", "main~5", "0000"):
        rc, out, err = run(capsys, "log", small, "--ref", ref)
        assert rc == 3 and out == "" and one_error_line(err).startswith("ckpt: error: ")
    rc, out, err = run(capsys, "tag", small, "bad..name", "--json")
    assert rc == 3 and json_error(err)["type"] == "InvalidRefName"


def test_usage_error_as_json(capsys, small):
    rc, out, err = run(capsys, "log", small, "--limit", "0", "--json")
    assert rc == 2 and out == ""
    e = json_error(err)
    assert e["type"] == "UsageError" and "--limit" in e["message"]
    rc, out, err = run(capsys, "tag", small, "first", "--json")  # exists: a plain error
    assert rc == 2 and "already exists" in json_error(err)["message"]


def test_corrupted_manifest_exits_4(capsys, small):
    with ckptstore.open(small, create=False) as store:
        head = store.resolve("main")
    path = Path(small, manifest_key(head))
    path.write_bytes(path.read_bytes()[:-7])  # truncated, as a torn write leaves it
    rc, out, err = run(capsys, "log", small)
    assert rc == EXIT_CORRUPT == 4 and out == ""
    assert head in one_error_line(err)
    rc, out, err = run(capsys, "show", small, "first", "--json")  # the intact commit still reads
    assert rc == 0 and json.loads(out)["message"] == "step 1"


def test_a_corrupted_chunk_exits_4_where_verify_exits_1(capsys, small, tmp_path):
    chunks = sorted(p for p in Path(small, "data").rglob("*") if p.is_file() and "/c/" in str(p))
    assert chunks
    for chunk in chunks:
        data = bytearray(chunk.read_bytes())
        data[len(data) // 2] ^= 0xFF
        chunk.write_bytes(bytes(data))
    rc, out, err = run(capsys, "export", small, "main", tmp_path / "x.safetensors", "--json")
    assert rc == EXIT_CORRUPT and out == ""
    assert json_error(err)["type"] == "CorruptedChunkError"
    assert not (tmp_path / "x.safetensors").exists()
    assert run(capsys, "verify", small)[0] == 1  # verify reports problems: its own status


def test_a_marker_that_is_not_ours_is_not_a_store(capsys, small):
    Path(small, MARKER).write_text('{"format": "something else"}')
    rc, out, err = run(capsys, "log", small, "--json")
    assert rc == 3 and out == "" and json_error(err)["type"] == "NotAStoreError"


@pytest.mark.s3
def test_unreachable_endpoint_fails_within_seconds(capsys):
    pytest.importorskip("s3fs")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.perf_counter()
    rc, out, err = run(capsys, "log", "s3://bucket/run", "-o", f"client_kwargs.endpoint_url="
                       f"http://127.0.0.1:{port}", "-o", "key=k", "-o", "secret=s")
    took = time.perf_counter() - t0
    assert rc == EXIT_STORAGE == 5 and out == ""
    assert f"127.0.0.1:{port}" in one_error_line(err)
    assert took < 5, f"gave up after {took:.1f} s"


def test_ctrl_c_exits_130_without_a_traceback(small):
    """SIGINT while ``ckpt`` waits on a read (the marker is a FIFO nobody writes)."""
    marker = Path(small, MARKER)
    marker.unlink()
    os.mkfifo(marker)
    proc = subprocess.Popen([sys.executable, "-m", "ckptstore", "log", small],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    writer = None
    try:
        deadline = time.monotonic() + 60
        while writer is None:  # opens once ckpt waits to read the marker
            try:
                writer = os.open(marker, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.poll()
                time.sleep(0.02)
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if writer is not None:
            os.close(writer)
        proc.kill()
    assert proc.returncode == EXIT_INTERRUPTED == 130
    assert out == "" and one_error_line(err) == "ckpt: interrupted"


# -- progress bars ---------------------------------------------------------------------------------
def _verify_on_a_terminal(small: str, *extra: str) -> tuple[int, str, str]:
    """``ckpt verify`` with stderr on a pseudo-terminal; returns (status, stdout, terminal)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))  # a new pty: 0x0
    real_stderr, real_stdout = sys.stderr, sys.stdout
    out = io.StringIO()
    try:
        sys.stderr = open(slave, "w", closefd=False)  # noqa: SIM115 - closed below
        sys.stdout = out
        rc = main(["verify", small, *extra])
        sys.stderr.flush()
    finally:
        sys.stderr.close()
        sys.stderr, sys.stdout = real_stderr, real_stdout
    os.set_blocking(master, False)
    seen = b""
    try:
        while chunk := os.read(master, 65536):
            seen += chunk
    except BlockingIOError:
        pass
    finally:
        os.close(slave)
        os.close(master)
    return rc, out.getvalue(), seen.decode(errors="replace")


def test_progress_only_on_a_terminal_and_not_with_json(capsys, small):
    rc, out, err = run(capsys, "verify", small)  # stderr is not a terminal here
    assert rc == 0 and out.startswith("ok:") and err == ""
    rc, out, term = _verify_on_a_terminal(small)
    assert rc == 0 and "verify" in term and out.startswith("ok:")
    rc, out, term = _verify_on_a_terminal(small, "--json")
    assert rc == 0 and json.loads(out)["ok"] is True and term == ""


@pytest.mark.parametrize("verb", ["log", "show", "tag", "branch", "gc", "rebase", "verify", "du",
                                  "diff", "export"])
def test_every_verb_takes_json(capsys, verb):
    rc, out, _ = run(capsys, verb, "--help")
    assert rc == 0 and "--json" in out


# -- start-up --------------------------------------------------------------------------------------
_PROBE = """
import json, sys
from ckptstore.cli import main
rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "torch": "torch" in sys.modules}), file=sys.stderr)
"""


@pytest.mark.parametrize("argv", [["log", "{url}"], ["log", "{url}", "--json"], ["tag", "{url}"],
                                  ["branch", "{url}", "exp", "first"]])
def test_history_and_ref_verbs_do_not_import_torch(small, argv):
    argv = [a.format(url=small) for a in argv]
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True,
                          text=True, timeout=120, check=False)
    probe = json.loads(done.stderr.strip().splitlines()[-1])
    assert probe == {"rc": 0, "torch": False}, done.stderr
    if argv[0] == "log":
        assert "step 2" in done.stdout


def test_import_ckptstore_is_lazy_yet_complete():
    done = subprocess.run([sys.executable, "-c", "import sys, ckptstore; "
                           "print('torch' in sys.modules)"], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.split() == ["False"]
    import ckptstore.store

    names: dict = {}
    exec("from ckptstore import *", names)  # every public name, as before the lazy imports
    assert set(ckptstore.__all__) <= set(names) and set(ckptstore.__all__) <= set(dir(ckptstore))
    assert names["open"] is ckptstore.open is ckptstore.store.open
    assert names["Store"] is ckptstore.Store and names["RefNotFound"] is ckptstore.RefNotFound
    assert ckptstore.policy.Policy is ckptstore.Policy  # submodules as attributes, as before
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ckptstore.nope  # noqa: B018
