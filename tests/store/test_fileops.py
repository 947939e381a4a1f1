"""A local store's file-system steps (ckptstore.storage.fileops): the compiled steps, each one
call with the GIL released, against their Python twins -- the same results, files and errors --
and the system calls the compiled ones make (strace, where the machine has it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

from ckptstore.storage import fileops
from helpers import spins_during

pytestmark = pytest.mark.skipif(not fileops.native,
                                reason="ckptstore.storage._files is not built here (not POSIX)")


@pytest.fixture(params=[True, False], ids=["compiled", "python"])
def steps(request, monkeypatch):
    """Each test once with the compiled steps, once with the Python ones."""
    monkeypatch.setattr(fileops, "native", request.param)
    return request.param


def _outcome(fn, *args):
    """What a step gives: ("ok", value) or ("error", exception class, errno, filename)."""
    try:
        return "ok", fn(*args)
    except OSError as e:
        return "error", type(e), e.errno, e.filename


def _both(monkeypatch, fn, *args, reset=None):
    """``fn(*args)`` under each implementation (``reset()`` before each); the two outcomes."""
    out = []
    for native in (True, False):
        if reset is not None:
            reset()
        monkeypatch.setattr(fileops, "native", native)
        out.append(_outcome(fn, *args))
    return out


# -- write_new ----------------------------------------------------------------------------
@pytest.mark.parametrize("parts", [
    [b"a" * 1000, memoryview(b"b" * 10), b"", b"c"],
    [np.arange(300, dtype=np.float32)],  # a numpy array: its bytes, not its length
    [bytes([i % 251]) * (i % 7) for i in range(2500)],  # more buffers than one writev takes
    [],
])
@pytest.mark.parametrize("sync", [fileops.SYNC_NONE, fileops.SYNC_FILE, fileops.SYNC_DATA])
def test_write_new_writes_every_part_in_order(tmp_path, steps, parts, sync):
    path = str(tmp_path / "f")
    expected = b"".join(memoryview(p).cast("B").tobytes() for p in parts)
    assert fileops.write_new(path, parts, fsync=sync) == len(expected)
    with open(path, "rb") as f:
        assert f.read() == expected
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o644 & ~_umask())


def _aligned(nbytes: int, offset: int = 0) -> np.ndarray:
    """``nbytes`` of varied bytes starting ``offset`` bytes past a page boundary."""
    raw = np.empty(nbytes + offset + 4096, np.uint8)
    start = -raw.ctypes.data % 4096 + offset
    out = raw[start:start + nbytes]
    out[:] = np.arange(nbytes, dtype=np.uint64) * 2654435761 >> 13
    return out


@pytest.mark.parametrize("parts", [
    [_aligned(4096 * 3 + 100), b"crc!"],              # in place, then the tail and the crc
    [_aligned(4096 * 3 + 100, 16), b"crc!"],          # not on a page (a malloc-ed body): cached
    [_aligned(4096 * 2), _aligned(4096), b"tail"],    # two in place, then the tail
    [_aligned(4096 * 2), _aligned(4096, 8), b"tail"],  # in place, then cached
    [_aligned(9 << 20)],                              # a large one in place
    [_aligned(4095, 0)],                              # less than a block: no direct write
    [_aligned(4096)],                                 # exactly a block: no tail
    [bytes([i % 251]) * (i % 7) for i in range(2500)],
    [],
], ids=["aligned", "unaligned", "two", "mixed", "large", "small", "block", "many", "empty"])
@pytest.mark.parametrize("sync", [fileops.SYNC_FILE, fileops.SYNC_DATA])
def test_direct_writes_write_every_part_in_order(tmp_path, steps, parts, sync):
    """``direct`` (a durable store's chunks): the same file, whatever the parts' alignment."""
    path = str(tmp_path / "f")
    expected = b"".join(memoryview(p).cast("B").tobytes() for p in parts)
    assert fileops.write_new(path, parts, sync, None, True, True) == len(expected)
    with open(path, "rb") as f:
        assert f.read() == expected


def test_direct_writes_fall_back_where_o_direct_is_refused(tmp_path, monkeypatch):
    """A file system without O_DIRECT (the Python twin: its fcntl refuses the flag): buffered."""
    monkeypatch.setattr(fileops, "native", False)
    real = fileops.fcntl.fcntl

    def refusing(fd, cmd, arg=0):
        if cmd == fileops.fcntl.F_SETFL and arg & os.O_DIRECT:
            raise OSError(22, "Invalid argument")
        return real(fd, cmd, arg)

    monkeypatch.setattr(fileops.fcntl, "fcntl", refusing)
    data = _aligned(3 << 20)  # on a page: the twin asks for O_DIRECT, and is refused
    assert fileops.write_new(str(tmp_path / "f"), [data], True, None, True, True) == data.size
    assert (tmp_path / "f").read_bytes() == data.tobytes()


def test_write_new_replaces_a_file_without_writing_through_its_links(tmp_path, steps):
    path, other = str(tmp_path / "f"), str(tmp_path / "g")
    with open(other, "wb") as f:
        f.write(b"shared")
    os.link(other, path)  # a chunk hard-linked from an earlier commit
    fileops.write_new(path, [b"new"], fsync=False)
    assert open(path, "rb").read() == b"new" and open(other, "rb").read() == b"shared"
    os.symlink(other, str(tmp_path / "s"))
    fileops.write_new(str(tmp_path / "s"), [b"x"], fsync=False)  # the link goes, not its file
    assert not os.path.islink(tmp_path / "s") and open(other, "rb").read() == b"shared"


def test_write_new_errors_match(tmp_path, monkeypatch):
    missing = str(tmp_path / "no" / "f")
    a, b = _both(monkeypatch, fileops.write_new, missing, [b"x"], False)
    assert a == b and a[1] is FileNotFoundError and a[3] == missing
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "inner").mkdir()  # a folder where the file goes: unlink fails
    a, b = _both(monkeypatch, fileops.write_new, str(tmp_path / "d" / "inner"), [b"x"], False)
    assert a[0] == b[0] == "error" and a[1] is b[1] and a[2] == b[2]
    with pytest.raises(TypeError):
        fileops.native = True
        fileops.write_new(str(tmp_path / "t"), [object()], False)


def test_write_new_inside_makes_and_checks_the_folder(tmp_path, monkeypatch):
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    outside.mkdir()
    real = str(root)

    def layout():
        shutil.rmtree(root, ignore_errors=True)
        (root / "data" / "there").mkdir(parents=True)
        os.symlink(outside, root / "linked")

    deep = root.joinpath("data", *"abcdefg")  # 7 missing folders above the file, 8 with c0
    cases = {  # the chunk's path -> what comes back
        root / "data" / "c0" / "0": 1,           # a new folder in a folder inside: written
        root / "linked" / "c0" / "0": -1,        # its parent leads out of the store
        root / "linked" / "new" / "c0" / "0": -1,  # so does its nearest existing ancestor
        root / "data" / "there" / "0": -1,       # its folder is there already: the checked way
        root / "missing" / "c0" / "0": 1,        # missing parents inside: made (an array's
        root / "data" / "a" / "c" / "0" / "0": 1,  # first chunk: its folder, c, the row's)
        deep / "h" / "c0" / "0": -1,             # 9 missing: the checked way
        deep / "c0" / "0": 1,                    # 8 missing: made
    }
    for path, expected in cases.items():
        a, b = _both(monkeypatch, fileops.write_new, str(path), [b"x"], True, real, reset=layout)
        assert a == b == ("ok", expected), path
        assert os.path.exists(path) == (expected == 1), path
    assert os.listdir(outside) == []


def test_write_new_refuses_an_unknown_sync(tmp_path, steps):
    with pytest.raises(ValueError, match="fsync is 0, 1 or 2"):
        fileops.write_new(str(tmp_path / "f"), [b"x"], 3)
    assert not (tmp_path / "f").exists()


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise here")
@pytest.mark.parametrize("sync", [fileops.SYNC_FILE, fileops.SYNC_DATA])
def test_write_new_drops_a_durable_file_from_the_page_cache(tmp_path, steps, sync):
    """``drop``: the file's pages leave the page cache once fsynced (mincore through a mapping
    says which are resident); without it they stay."""
    import ctypes
    import mmap

    def resident(path: str) -> int:
        libc = ctypes.CDLL(None, use_errno=True)
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as m:
            pages = (len(m) + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            view = ctypes.c_char.from_buffer(m)  # a copy-on-write mapping: nothing written
            try:
                assert libc.mincore(ctypes.c_void_p(ctypes.addressof(view)),
                                    ctypes.c_size_t(len(m)), vec) == 0
            finally:
                del view
            return sum(v & 1 for v in vec)

    data = [np.ones(4 << 20, np.uint8)]
    kept, dropped = str(tmp_path / "kept"), str(tmp_path / "dropped")
    fileops.write_new(kept, data, fsync=sync)
    fileops.write_new(dropped, data, fsync=sync, drop=True)
    assert resident(kept) > 0.9 * (4 << 20) // mmap.PAGESIZE
    assert resident(dropped) < 0.1 * (4 << 20) // mmap.PAGESIZE
    assert open(dropped, "rb").read() == bytes(data[0])


# -- resolve_existing ---------------------------------------------------------------------
def test_resolve_existing_matches_its_twin(tmp_path, monkeypatch):
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, root / "out")                 # a folder linked out of the root
    os.symlink(root / "a", root / "alias")            # a link inside
    os.symlink(root / "nowhere", root / "dangling")   # a dangling link
    os.symlink(root / "loop", root / "loop")          # a loop
    cases = [root / "a" / "b", root / "a" / "b" / "x" / "y", root / "out" / "c",
             root / "alias" / "b" / "new", root / "dangling" / "new", root / "loop" / "x",
             tmp_path / "not-made" / "x", root]
    for path in cases:
        a, b = _both(monkeypatch, fileops.resolve_existing, str(path), str(root))
        assert a == b, path
    assert fileops.resolve_existing(str(root / "out" / "c"), str(root))[1] == str(outside)
    stop = str(tmp_path / "not-made")
    assert fileops.resolve_existing(stop + "/x/y", stop) is None  # the root not made yet


# -- make_folders -------------------------------------------------------------------------
def test_make_folders_matches_its_twin(tmp_path, monkeypatch):
    target = tmp_path / "a" / "b" / "c"

    def reset():
        shutil.rmtree(tmp_path / "a", ignore_errors=True)

    a, b = _both(monkeypatch, fileops.make_folders, str(target), reset=reset)
    assert a == b == ("ok", [str(tmp_path / "a"), str(tmp_path / "a" / "b"), str(target)])
    assert fileops.make_folders(str(target)) == []  # all there
    (tmp_path / "f").write_bytes(b"")  # a file in the way
    a, b = _both(monkeypatch, fileops.make_folders, str(tmp_path / "f" / "x"))
    assert a == b and a[0] == "error" and a[1] is NotADirectoryError


def test_make_folders_passes_over_folders_another_writer_makes(tmp_path, steps):
    results: list[list[str]] = []
    barrier = threading.Barrier(4)

    def make() -> None:
        barrier.wait()
        results.append(fileops.make_folders(str(tmp_path / "x" / "y" / "z")))

    threads = [threading.Thread(target=make) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    made = sorted(m for r in results for m in r)
    assert made == sorted({str(tmp_path / "x"), str(tmp_path / "x" / "y"),
                           str(tmp_path / "x" / "y" / "z")})  # each made by exactly one


# -- fsync_tree ---------------------------------------------------------------------------
def test_fsync_tree_walks_folders_and_skips_what_is_gone(tmp_path, monkeypatch):
    root = tmp_path / "root"
    (root / "data" / "c1" / "c" / "0").mkdir(parents=True)
    (root / "data" / "c1" / "c" / "1").mkdir()
    (root / "data" / "c1" / "c" / "0" / "0").write_bytes(b"chunk")
    os.symlink("/proc", root / "data" / "c1" / "linked")  # never walked
    os.mkfifo(root / "data" / "c1" / "fifo")  # not a file to fsync (opening it would block)
    for path in (root / "data" / "c1", root / "data" / "gone"):
        for files in (False, True):
            a, b = _both(monkeypatch, fileops.fsync_tree, str(path), str(root), files)
            assert a == b == ("ok", None)


def _fs_magic(path) -> int:
    """The file system type of ``path`` (statfs's f_type, from coreutils' stat)."""
    out = subprocess.run(["stat", "-f", "-c", "%t", str(path)], capture_output=True, text=True,
                         check=True).stdout
    return int(out, 16)


_BATCH_MAGICS = {0xEF53, 0x58465342, 0x9123683E, 0xF2F52010, 0x01021994}


@pytest.mark.skipif(sys.platform != "linux" or shutil.which("stat") is None,
                    reason="syncfs and statfs are Linux's")
def test_batch_fs_and_sync_store_know_their_file_systems(tmp_path, monkeypatch):
    """Batched durability on the file systems whose syncfs makes everything durable; elsewhere
    (procfs here stands for a network or FUSE file system) nothing is done and False says so.
    The Python steps have no syncfs: False."""
    batch = _fs_magic(tmp_path) in _BATCH_MAGICS
    assert fileops.batch_fs(str(tmp_path)) is (batch and fileops._kernel_reports_syncfs_errors())
    assert fileops.sync_store(str(tmp_path), str(tmp_path.parent)) is batch
    assert fileops.batch_fs("/proc") is False
    assert fileops.sync_store("/proc/self", "/") is False
    assert fileops.sync_store(str(tmp_path / "gone"), str(tmp_path)) is False
    monkeypatch.setattr(fileops, "native", False)
    assert fileops.batch_fs(str(tmp_path)) is False
    assert fileops.sync_store(str(tmp_path), str(tmp_path.parent)) is False


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed here")
def test_compiled_steps_make_the_expected_system_calls(tmp_path):
    script = (
        "import sys; from ckptstore.storage import fileops as f; r = sys.argv[1]\n"
        "f.make_folders(r + '/d/c/0'); f.write_new(r + '/d/c/0/0', [b'a', b'b'], True)\n"
        "f.write_new(r + '/d/c/0/1', [b'a'], False); f.fsync_tree(r + '/d', r)\n")
    trace = subprocess.run(
        ["strace", "-f", "-e", "trace=openat,writev,fsync,mkdir,unlink", sys.executable, "-c",
         script, str(tmp_path)], capture_output=True, text=True, check=True).stderr
    ours = [line for line in trace.splitlines() if str(tmp_path) in line or "writev(" in line
            or "fsync(" in line]
    calls = [line.split("(")[0].split("]")[-1].strip() for line in ours]
    # the folders, the durable chunk (open, one writev, fsync), the other (no fsync)
    assert calls[:8] == ["mkdir"] * 3 + ["openat", "writev", "fsync", "openat", "writev"]
    # then every folder of the tree listed, and fsynced deepest first, and the root above it
    synced = [ours[i].split('"')[1] for i in range(8, len(ours) - 1)
              if calls[i] == "openat" and calls[i + 1] == "fsync"]
    r = str(tmp_path)
    assert synced == [r + "/d/c/0", r + "/d/c", r + "/d", r]
    assert calls.count("fsync") == 5


def test_fsync_tree_with_files_fsyncs_each_regular_file_before_the_folders(tmp_path,
                                                                            monkeypatch):
    """The Python steps (the compiled ones: the strace test below): every regular file under the
    folder, then the folders deepest first and those above; links and FIFOs are not opened."""
    root = tmp_path / "root"
    (root / "d" / "c").mkdir(parents=True)
    for name in ("d/zarr.json", "d/c/0", "d/c/1"):
        (root / name).write_bytes(b"x")
    os.symlink(root / "d" / "c" / "0", root / "d" / "c" / "link")
    os.mkfifo(root / "d" / "fifo")
    monkeypatch.setattr(fileops, "native", False)
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        real(fd)
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))

    monkeypatch.setattr(os, "fsync", fsync)
    fileops.fsync_tree(str(root / "d"), str(tmp_path), files=True)
    files = {str(root / n) for n in ("d/zarr.json", "d/c/0", "d/c/1")}
    assert set(synced[:3]) == files
    assert synced[3:] == [str(root / "d" / "c"), str(root / "d"), str(root), str(tmp_path)]
    synced.clear()
    fileops.fsync_tree(str(root / "d"), str(tmp_path))
    assert not files & set(synced)


@pytest.mark.skipif(shutil.which("strace") is None or sys.platform != "linux",
                    reason="strace is not installed here")
def test_sync_store_fsyncs_the_folders_above_on_other_file_systems(tmp_path):
    """A store folder on a tmpfs under a root on another file system: syncfs of the tmpfs, then
    an fsync of each folder above it whose device differs (not of those on the tmpfs)."""
    shm = "/dev/shm"
    if not os.path.isdir(shm) or _fs_magic(shm) != 0x01021994 or (
            os.stat(shm).st_dev == os.stat("/dev").st_dev):
        pytest.skip("no tmpfs at /dev/shm on another device than /dev here")
    import tempfile
    folder = tempfile.mkdtemp(dir=shm)
    try:
        os.mkdir(os.path.join(folder, "c"))
        script = ("import sys; from ckptstore.storage import fileops as f\n"
                  "assert f.sync_store(sys.argv[1] + '/c', '/')\n")
        trace = subprocess.run(
            ["strace", "-f", "-e", "trace=openat,fsync,syncfs", sys.executable, "-c", script,
             folder], capture_output=True, text=True, check=True).stderr.splitlines()
    finally:
        shutil.rmtree(folder)
    start = next(i for i, line in enumerate(trace) if "syncfs(" in line)
    synced = [trace[i].split('"')[1] for i in range(start + 1, len(trace) - 1)
              if "openat(" in trace[i] and "fsync(" in trace[i + 1]]
    assert synced == ["/dev", "/"]


@pytest.mark.skipif(shutil.which("strace") is None or sys.platform != "linux",
                    reason="strace is not installed here")
def test_batched_durability_makes_the_expected_system_calls(tmp_path):
    """SYNC_DATA writes a file's data out (sync_file_range, no fsync); sync_store syncs its
    file system once (syncfs, after statfs says which); fsync_tree with files fsyncs each
    file, then each folder."""
    if _fs_magic(tmp_path) not in _BATCH_MAGICS:
        pytest.skip("the temporary folder's file system does not take batched durability")
    script = (
        "import mmap, sys; from ckptstore.storage import fileops as f; r = sys.argv[1]\n"
        "f.make_folders(r + '/d/c'); f.write_new(r + '/d/c/0', [b'a' * 5000], 2, None, True)\n"
        "m = mmap.mmap(-1, 2 * 4096 + 10); m.write(b'y' * (2 * 4096 + 10))\n"
        "f.write_new(r + '/d/c/1', [memoryview(m)], 2, None, True, True)\n"
        "assert f.sync_store(r + '/d', r)\n"
        "f.fsync_tree(r + '/d', r, True)\n")
    trace = subprocess.run(
        ["strace", "-f", "-e", "trace=openat,write,writev,fsync,fdatasync,sync_file_range,"
         "syncfs,fstatfs,fadvise64", sys.executable, "-c", script, str(tmp_path)],
        capture_output=True, text=True, check=True).stderr
    r = str(tmp_path)
    ours = [line for line in trace.splitlines() if r in line or any(
        f"{c}(" in line for c in ("writev", "fsync", "sync_file_range", "syncfs", "fstatfs",
                                  "fadvise64")) or line.split("(")[0].endswith("write")]
    calls = [line.split("(")[0].split("]")[-1].strip() for line in ours]
    start = calls.index("writev") - 1
    assert calls[start:start + 4] == ["openat", "writev", "sync_file_range", "fadvise64"]
    # the page-aligned buffer: its front past the cache (write), the tail written out
    assert calls[start + 4:start + 9] == ["openat", "write", "writev", "sync_file_range",
                                          "fadvise64"]
    sync = calls.index("syncfs")
    assert "fsync" not in calls[:sync] and "fdatasync" not in calls
    assert calls[sync - 2:sync + 1] == ["openat", "fstatfs", "syncfs"]
    assert calls.count("syncfs") == 1
    synced = [ours[i].split('"')[1] for i in range(sync + 1, len(ours) - 1)
              if calls[i] == "openat" and calls[i + 1] == "fsync"]
    assert synced == [r + "/d/c/0", r + "/d/c/1", r + "/d/c", r + "/d", r]  # files, folders


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed here")
def test_direct_writes_go_past_the_page_cache(tmp_path):
    """With ``direct``, the aligned front of a buffer on a page is written with O_DIRECT set and
    the tail without; a buffer that is not on a page is written as without ``direct``."""
    script = (
        "import mmap, sys; from ckptstore.storage import fileops as f\n"
        "m = mmap.mmap(-1, 3 * 4096 + 10); m.write(b'x' * (3 * 4096 + 10))\n"
        "f.write_new(sys.argv[1] + '/c', [memoryview(m)], True, None, True, True)\n"
        "f.write_new(sys.argv[1] + '/d', [b'x' * 20000], True, None, True, True)\n")
    trace = subprocess.run(
        ["strace", "-f", "-e", "trace=fcntl,write,writev,fsync", sys.executable, "-c", script,
         str(tmp_path)], capture_output=True, text=True, check=True).stderr
    lines = [line for line in trace.splitlines() if "F_SETFL" in line or "write" in line
             or "fsync(" in line]
    steps = [("set" if "O_DIRECT" in line else "clear") if "F_SETFL" in line
             else line.split("(")[0].split("]")[-1].strip() for line in lines]
    start = steps.index("set")
    assert steps[start:start + 5] == ["set", "write", "clear", "writev", "fsync"]
    assert "= 12288" in lines[start + 1] and "= 10" in lines[start + 3]
    assert steps[start + 5:] == ["writev", "fsync"]  # the bytes object: through the cache
    assert (tmp_path / "c").read_bytes() == b"x" * (3 * 4096 + 10)
    assert (tmp_path / "d").read_bytes() == b"x" * 20000


def test_a_step_lets_other_threads_run(tmp_path, steps):
    """The compiled step runs without the GIL: a thread spinning in Python keeps going while a
    large fsynced write runs (the Python twin releases it too, once per call)."""
    data = np.zeros(64 << 20, dtype=np.uint8)
    assert spins_during(lambda: fileops.write_new(str(tmp_path / "big"), [data], fsync=True)) > 0


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
