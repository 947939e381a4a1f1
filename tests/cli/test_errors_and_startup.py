"""``ckpt`` failing well and starting fast: one-line errors with documented exit statuses (also as
JSON), bounded waits on dead endpoints, Ctrl-C (also in an import and its chunk writes), progress
only on a terminal or with ``--progress``, no torch for ``log``, ``tag``, ``branch``, ``show``
and ``du``.
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
from ckptstore.cli import (
    EXIT_CORRUPT,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_STORAGE,
    EXIT_USAGE,
    main,
)
from ckptstore.format.layout import MARKER, manifest_key


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


def test_a_fifo_marker_is_refused_at_once(small):
    """The marker a FIFO nobody writes: ``ckpt`` refuses it at once in one line (a store holds
    regular files only; no read of one waits -- issue 26 item 6). Ctrl-C during a read that
    waits: ``test_ctrl_c_during_an_import``."""
    marker = Path(small, MARKER)
    marker.unlink()
    os.mkfifo(marker)
    proc = subprocess.run([sys.executable, "-m", "ckptstore", "log", small],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode not in (0, EXIT_INTERRUPTED) and proc.stdout == ""
    assert "is a FIFO" in one_error_line(proc.stderr)


def test_a_fifo_as_import_source_is_refused_at_once(tmp_path):
    """A FIFO nobody writes is refused, not waited on (issue 26: imports read regular files
    only; Ctrl-C during an import is tested while it writes chunks, below)."""
    source = tmp_path / "model.pt"
    os.mkfifo(source)
    url = tmp_path / "imported"
    proc = subprocess.run([sys.executable, "-m", "ckptstore", "import", str(url), str(source),
                           "--format", "torch"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "not a regular file" in one_error_line(proc.stderr)


_SLOW_WRITES = """
import sys, time
from ckptstore.storage.local import LocalStorage
put_chunk = LocalStorage.put_chunk
def slow_put_chunk(self, key, data):
    open(sys.argv[1], "a").close()  # the commit is writing chunks
    time.sleep(0.5)
    put_chunk(self, key, data)
LocalStorage.put_chunk = slow_put_chunk
from ckptstore.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_ctrl_c_while_an_import_writes_chunks(tmp_path):
    """SIGINT while the commit's I/O threads write chunks: one line, no traceback from them, an
    exit within seconds (not after every chunk), and nothing committed."""
    import torch

    safetensors_torch = pytest.importorskip("safetensors.torch")
    source = tmp_path / "model.safetensors"
    safetensors_torch.save_file({f"w{i}": torch.full((2**20 // 4,), i) for i in range(40)},
                                str(source))  # 40 arrays of 1 MiB: 40 chunk writes
    url, writing = tmp_path / "imported", tmp_path / "writing"
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_WRITES, str(writing), "import",
                             str(url), str(source)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not writing.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        proc.kill()
    assert proc.returncode == EXIT_INTERRUPTED
    assert out == "" and one_error_line(err) == "ckpt: interrupted"
    assert took < 8, f"{took:.1f} s after Ctrl-C"  # writing all 40 chunks takes 10 s or more
    with ckptstore.open(url, create=False) as store:
        assert store.branches() == {}


def test_ctrl_c_in_import_as_text_and_json(capsys, monkeypatch, small, tmp_path):
    import ckptstore.importing

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ckptstore.importing, "import_checkpoint", interrupted)
    rc, out, err = run(capsys, "import", small, tmp_path / "x.safetensors")
    assert rc == EXIT_INTERRUPTED and out == "" and one_error_line(err) == "ckpt: interrupted"
    rc, out, err = run(capsys, "import", small, tmp_path / "x.safetensors", "--json")
    assert rc == EXIT_INTERRUPTED and out == ""
    assert json_error(err) == {"type": "KeyboardInterrupt", "message": "interrupted",
                               "exit_status": 130}


def test_ctrl_c_is_reported_even_when_closing_fails(capsys, monkeypatch, small):
    from ckptstore.store import Store

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    def broken_close(self):
        raise RuntimeError("close failed")

    monkeypatch.setattr(Store, "verify", interrupted)
    monkeypatch.setattr(Store, "close", broken_close)
    rc, out, err = run(capsys, "verify", small)
    assert rc == EXIT_INTERRUPTED and out == "" and one_error_line(err) == "ckpt: interrupted"


def test_after_ctrl_c_queued_io_is_dropped_not_waited_for(small):
    """``Context.close(interrupted=True)``: chunk jobs not yet started are cancelled."""
    from ckptstore.cli._context import Context
    from ckptstore.cli._open import open_existing

    ctx = Context(None, open_existing(small, {}), io.StringIO(), io.StringIO())
    jobs = [ctx.repo.executor.submit(time.sleep, 0.2) for _ in range(20 * ctx.repo.io_workers)]
    t0 = time.perf_counter()
    ctx.close(interrupted=True)
    assert time.perf_counter() - t0 < 2  # all 20 rounds would take 4 s
    assert sum(j.cancelled() for j in jobs) >= len(jobs) - 2 * ctx.repo.io_workers


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


@pytest.fixture
def chained(tmp_path) -> str:
    """A store of three torch commits: a consecutive chain of an embedding table (own arrays),
    small tensors packed together, a bfloat16 one; the first is tagged."""
    import torch

    from ckptstore.policy import Policy

    url = str(tmp_path / "chained")
    emb = torch.zeros(2048, 16)
    with ckptstore.open(url, policy=Policy(incremental="consecutive", min_rows=64)) as store:
        for step in (1, 2, 3):
            emb[step * 10] += step
            store.commit({"model": {"emb": emb, "fc": torch.ones(4, 4, dtype=torch.bfloat16)},
                          "step": step, "lr": 0.1}, message=f"step {step}",
                         tags=["first"] if step == 1 else ())
    return url


def test_gc_rebase_and_du_show_progress_and_keep_json_valid(capsys, chained):
    for argv in (["du", chained], ["rebase", chained], ["gc", chained, "-n", "--keep-last", "1"]):
        rc, out, err = run(capsys, *argv, "--json")  # stderr is not a terminal: no bar
        assert rc == 0 and json.loads(out) and err == ""
    rc, out, err = run(capsys, "du", chained, "--json", "--progress")
    assert rc == 0 and len(json.loads(out)["commits"]) == 4
    assert "du: " in err and "commit" in err
    rc, out, err = run(capsys, "rebase", chained, "--json", "--progress")
    assert rc == 0 and json.loads(out)["message"].startswith("rebase of ")
    assert "rebase: read" in err and "rebase: write" in err
    rc, out, err = run(capsys, "gc", chained, "--keep-last", "1", "--no-keep-tags", "--grace", "0",
                       "--json", "--progress")
    doc = json.loads(out)
    assert rc == 0 and len(doc["commits_removed"]) == 4 and doc["tags_removed"] == ["first"]
    assert "gc: scan" in err and "gc: remove" in err
    rc, out, err = run(capsys, "gc", chained, "--dry-run", "--progress")  # text output too
    assert rc == 0 and out.startswith("dry run: would remove 0 commits") and "gc: scan" in err
    assert "gc: remove" not in err


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


def _run_without_torch(argv: list[str]) -> subprocess.CompletedProcess:
    """Run ``ckpt argv`` in a fresh interpreter; assert it succeeded without importing torch."""
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True,
                          text=True, timeout=120, check=False)
    probe = json.loads(done.stderr.strip().splitlines()[-1])
    assert probe == {"rc": 0, "torch": False}, done.stderr
    return done


@pytest.mark.parametrize("argv", [["log", "{url}"], ["log", "{url}", "--json"], ["tag", "{url}"],
                                  ["branch", "{url}", "exp", "first"]])
def test_history_and_ref_verbs_do_not_import_torch(small, argv):
    argv = [a.format(url=small) for a in argv]
    done = _run_without_torch(argv)
    if argv[0] == "log":
        assert "step 2" in done.stdout


@pytest.mark.parametrize("argv", [["show", "{url}"], ["show", "{url}", "first", "--json"],
                                  ["show", "{url}", "--paths", "model.emb"], ["du", "{url}"],
                                  ["du", "{url}", "--json"], ["du", "{url}", "--ref", "main~1"]])
def test_show_and_du_do_not_import_torch(chained, argv):
    """They read manifests and listings only; sizes come from dtype names (ckptstore.format.dtypes)."""
    argv = [a.format(url=chained) for a in argv]
    done = _run_without_torch(argv)
    if argv[0] == "show" and "--json" not in argv:
        assert "consecutive on" in done.stdout and "model.emb" in done.stdout
    if argv[-1] == "--json":
        doc = json.loads(done.stdout)
        if argv[0] == "show":
            assert {t["dtype"] for t in doc["tensors"]} == {"float32", "bfloat16"}
            assert {t["path"]: t["nbytes"] for t in doc["tensors"]} == {
                "model.emb": 2048 * 16 * 4, "model.fc": 16 * 2}
        else:
            assert len(doc["commits"]) == 3 and doc["commits"][0]["shared_bytes"] > 0


def test_import_ckptstore_is_lazy_yet_complete():
    done = subprocess.run([sys.executable, "-c", ("import sys, ckptstore; "
                                                  "print('torch' in sys.modules)")],
                          capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["False"]
    import ckptstore.store

    names: dict = {}
    exec("from ckptstore import *", names)  # noqa: S102 - every public name, as before lazy imports
    assert set(ckptstore.__all__) <= set(names) and set(ckptstore.__all__) <= set(dir(ckptstore))
    assert names["open"] is ckptstore.open is ckptstore.opening.open
    assert names["Store"] is ckptstore.Store and names["RefNotFound"] is ckptstore.RefNotFound
    assert ckptstore.policy.Policy is ckptstore.Policy  # submodules as attributes, as before
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ckptstore.nope  # noqa: B018
