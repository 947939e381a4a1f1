"""Worker processes for the crash and concurrency tests (a program, not a test module).

Run as a program; every worker writes one JSON object per line on stdout (``event`` names it,
``pid`` says which process wrote it)::

    python tests/workers.py commit URL [--opts JSON] [--seed S] [--count N] [--branch B]
        [--profile crash|small] [--retry] [--kill-after-writes N] [--kill-mode after|torn]
        [--trace-writes] [--barrier DIR --parties P [--barrier-rounds R]]
    python tests/workers.py tag URL NAME [--ref REF] [--opts JSON] [--barrier DIR --parties P]
    python tests/workers.py branch URL NAME [--ref REF] [--opts JSON] [--barrier DIR --parties P]
    python tests/workers.py serve

``commit`` commits ``build_state(seed)``, ``build_state(seed + 1)``, ... (the seed is recorded in
the commit's metadata, so a checker can recompute what a commit must hold). Events: ``start``,
``ready`` (states built, commits begin), ``commit`` (id, seed, attempt, seconds), ``conflict``
(a ConcurrentUpdateError: commit_id, branch, message), ``write`` (with ``--trace-writes``).

Fault injection, inside this process only: ``--kill-after-writes N`` wraps the store's write
methods (``Storage.put_chunk``, ``put``, ``put_if_absent``) and SIGKILLs the process at its N-th
write: ``after`` the write completed, or ``torn``: a chunk half written, or (local disks) a
put-if-absent whose temporary file is written but not yet linked into place.

``--barrier DIR --parties P`` makes the first ``R`` branch moves (``Refs.advance``) or the tag
creation wait until ``P`` parties arrived there, so that their put-if-absent calls race tightly.
A party is a file ``DIR/<name>.<id>`` (``advance-1``, ``tag-<tag>``): a test can be one party
itself, holding a worker between reading the tip and moving the branch until it creates its file.

``serve`` is a fork server: it imports torch and ckptstore once, then for each JSON command on
stdin (``{"op": "spawn", "argv": [...]}`` or ``{"op": "wait", "pid": N}``) forks a worker or reaps
one. Killing many short-lived workers then costs milliseconds each instead of an interpreter start.
:class:`ForkServer` is the test-side client.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Any

WORKERS = os.path.abspath(__file__)
CHUNK_BYTES = 256 * 1024  # the crash profile's big tensor becomes 12 chunk files


# -- deterministic states -------------------------------------------------------------------------
def build_state(seed: int, profile: str = "crash") -> dict[str, Any]:
    """The state a worker commits for ``seed`` (same seed, same bits, in any process)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    if profile == "small":
        return {"w": torch.randn(96, 256, generator=g),  # 96 KiB: an array of its own
                "b": torch.randn(16, generator=g), "step": seed}
    if profile != "crash":
        raise ValueError(f"unknown profile {profile!r}")
    return {
        "model": {
            "emb": torch.randn(768, 1024, generator=g),  # 3 MiB float32: 12 chunks of 256 KiB
            "proj": torch.randn(256, 256, generator=g).to(torch.float16),  # 128 KiB: 1 chunk
            "bias": torch.randn(1024, generator=g),  # small ones share the packed array
            "norm": torch.randn(300, generator=g).to(torch.bfloat16),
            "counts": torch.randint(0, 2**40, (50,), generator=g, dtype=torch.int64),
            "mask": torch.rand(33, generator=g) > 0.5,
        },
        "optim": {"lr": 1e-3 * (1 + seed % 7), "betas": [0.9, 0.999], "name": f"adam-{seed}"},
        "rng": bytes(torch.randint(0, 256, (16,), generator=g, dtype=torch.uint8).tolist()),
        "step": seed,
    }


# -- output ---------------------------------------------------------------------------------------
def emit(event: str, **fields: Any) -> None:
    """One JSON line in a single write() (atomic on a pipe), flushed before anything else."""
    line = json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n"
    os.write(1, line.encode())


# -- fault injection and barriers (this process only) ---------------------------------------------
def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # never reached


def arm_kill_switch(after_writes: int | None, mode: str = "after", trace: bool = False) -> None:
    """Count every store write in this process; SIGKILL at write number ``after_writes``."""
    from ckptstore.storage import FsspecStorage, LocalStorage, Storage

    lock = threading.Lock()
    count = [0]

    def wrap(cls: type[Storage], name: str) -> None:
        original = getattr(cls, name)

        def write(self: Storage, key: str, data: bytes, *args: Any, **kwargs: Any) -> Any:
            with lock:
                count[0] += 1
                n = count[0]
            if trace:
                emit("write", n=n, method=name, key=key, size=len(data))
            if n != after_writes:
                return original(self, key, data, *args, **kwargs)
            if mode == "torn":
                if name == "put_chunk":  # half a chunk reaches the disk or the object store
                    original(self, key, data[: len(data) // 2], *args, **kwargs)
                elif self.local_disk:  # temporary file written and synced, never linked/renamed
                    os.link = os.replace = lambda *a, **k: _die()
                    original(self, key, data, *args, **kwargs)
                _die()  # an object store PUT is all or nothing: die before it
            result = original(self, key, data, *args, **kwargs)
            _die()
            return result

        setattr(cls, name, write)

    for cls in (LocalStorage, FsspecStorage):
        for name in ("put_chunk", "put", "put_if_absent"):
            wrap(cls, name)


def barrier_wait(directory: str, parties: int, name: str, timeout: float = 60.0) -> None:
    """File barrier: announce arrival in ``directory``; return once ``parties`` arrived."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{name}.{os.getpid()}"), "w"):
        pass
    deadline = time.monotonic() + timeout
    while sum(n.startswith(name + ".") for n in os.listdir(directory)) < parties:
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier {name!r} in {directory}: fewer than {parties} arrived")
        time.sleep(0.0005)


def arm_barrier(directory: str, parties: int, rounds: int = 1) -> None:
    """Make the first ``rounds`` branch moves and every tag creation wait at the barrier."""
    from ckptstore.history.refs import Refs

    advance, create_tag = Refs.advance, Refs.create_tag
    seen = [0]

    def barrier_advance(self: Refs, branch: str, expected: Any, commit_id: str) -> int:
        seen[0] += 1
        if seen[0] <= rounds:
            barrier_wait(directory, parties, f"advance-{seen[0]}")
        return advance(self, branch, expected, commit_id)

    def barrier_create_tag(self: Refs, name: str, commit_id: str) -> None:
        barrier_wait(directory, parties, f"tag-{name}")
        return create_tag(self, name, commit_id)

    Refs.advance, Refs.create_tag = barrier_advance, barrier_create_tag


# -- commands -------------------------------------------------------------------------------------
def _open(url: str, opts: str, profile: str = "crash") -> Any:
    import ckptstore

    options = json.loads(opts)
    if options.get("client_kwargs", {}).get("endpoint_url"):  # the moto test server
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    enc = ckptstore.EncodingOptions(chunk_bytes=CHUNK_BYTES if profile == "crash" else 2**20)
    return ckptstore.open(url, options=enc, **options)


def cmd_commit(args: argparse.Namespace) -> int:
    import ckptstore

    store = _open(args.url, args.opts, args.profile)
    states = [(args.seed + i, build_state(args.seed + i, args.profile)) for i in range(args.count)]
    if args.barrier:
        arm_barrier(args.barrier, args.parties, args.barrier_rounds)
    if args.kill_after_writes is not None or args.trace_writes:
        arm_kill_switch(args.kill_after_writes, args.kill_mode, args.trace_writes)
    emit("ready")
    for seed, state in states:
        for attempt in range(1, args.max_attempts + 1):
            t0 = time.perf_counter()
            try:
                info = store.commit(state, message=f"seed {seed}", branch=args.branch,
                                    metadata={"seed": seed, "profile": args.profile})
            except ckptstore.ConcurrentUpdateError as e:
                emit("conflict", seed=seed, attempt=attempt, commit_id=e.commit_id,
                     branch=e.branch, message=str(e))
                if not args.retry:
                    return 2
                continue
            emit("commit", id=info.id, parent=info.parent, seed=seed, attempt=attempt,
                 seconds=time.perf_counter() - t0)
            break
        else:
            emit("gave_up", seed=seed)
            return 3
    store.close()
    return 0


def cmd_tag(args: argparse.Namespace) -> int:
    import ckptstore

    store = _open(args.url, args.opts)
    if args.barrier:
        arm_barrier(args.barrier, args.parties)
    emit("ready")
    try:
        commit_id = store.tag(args.name, args.ref)
    except ckptstore.RefExists as e:
        emit("refexists", name=args.name, message=str(e))
        return 2
    emit("tag", name=args.name, id=commit_id)
    store.close()
    return 0


def cmd_branch(args: argparse.Namespace) -> int:
    import ckptstore

    store = _open(args.url, args.opts)
    if args.barrier:
        arm_barrier(args.barrier, args.parties)
    emit("ready")
    try:
        commit_id = store.branch(args.name, args.ref)
    except ckptstore.CkptStoreError as e:
        emit("error", type=type(e).__name__, message=str(e))
        return 2
    emit("branch", name=args.name, id=commit_id)
    store.close()
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Fork server: no threads and no torch computation here, so forking stays safe."""
    import torch  # noqa: F401

    import ckptstore  # noqa: F401 - imported once, inherited by every worker
    import ckptstore.maintenance.gc  # noqa: F401
    import ckptstore.maintenance.verify  # noqa: F401
    try:
        import s3fs  # noqa: F401
    except ImportError:
        pass
    emit("serving")
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "spawn":
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = main(cmd["argv"])
                except BaseException:  # noqa: BLE001 - report, then leave without cleanup
                    import traceback
                    traceback.print_exc()
                finally:
                    sys.stderr.flush()
                    os._exit(code)
            emit("spawned", child=pid)
        elif cmd["op"] == "wait":
            _, status = os.waitpid(cmd["child"], 0)
            emit("exited", child=cmd["child"], returncode=os.waitstatus_to_exitcode(status))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="workers.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("commit")
    c.add_argument("url")
    c.add_argument("--opts", default="{}", help="fsspec storage options as JSON")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--count", type=int, default=1)
    c.add_argument("--branch", default="main")
    c.add_argument("--profile", choices=["crash", "small"], default="crash")
    c.add_argument("--retry", action="store_true", help="retry on ConcurrentUpdateError")
    c.add_argument("--max-attempts", type=int, default=100)
    c.add_argument("--kill-after-writes", type=int)
    c.add_argument("--kill-mode", choices=["after", "torn"], default="after")
    c.add_argument("--trace-writes", action="store_true")
    c.add_argument("--barrier")
    c.add_argument("--parties", type=int, default=2)
    c.add_argument("--barrier-rounds", type=int, default=1)
    c.set_defaults(fn=cmd_commit)
    t = sub.add_parser("tag")
    t.add_argument("url")
    t.add_argument("name")
    t.add_argument("--ref", default="main")
    t.add_argument("--opts", default="{}")
    t.add_argument("--barrier")
    t.add_argument("--parties", type=int, default=2)
    t.set_defaults(fn=cmd_tag)
    b = sub.add_parser("branch")
    b.add_argument("url")
    b.add_argument("name")
    b.add_argument("--ref", default="main")
    b.add_argument("--opts", default="{}")
    b.add_argument("--barrier")
    b.add_argument("--parties", type=int, default=2)
    b.set_defaults(fn=cmd_branch)
    s = sub.add_parser("serve")
    s.set_defaults(fn=cmd_serve)
    args = parser.parse_args(argv)
    if args.command != "serve":
        emit("start", command=args.command)
    return args.fn(args)


# -- test side ------------------------------------------------------------------------------------
class WorkerError(AssertionError):
    """A worker or the fork server misbehaved (timeout, crash, bad output)."""


class ForkServer:
    """Client of ``workers.py serve``: spawn workers, read their events, kill and reap them.

    Every wait has a timeout; on a timeout the workers still running are SIGKILLed and
    :class:`WorkerError` is raised, so a hang fails a test instead of hanging the run.
    """

    def __init__(self, stderr_path: str, timeout: float = 60.0):
        self.timeout = timeout
        self.stderr_path = stderr_path
        self._stderr = open(stderr_path, "wb")
        self.proc = subprocess.Popen([sys.executable, WORKERS, "serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr)
        self._cond = threading.Condition()
        self._events: dict[int, list[dict]] = {}
        self._replies: queue.Queue[dict] = queue.Queue()
        self._alive: set[int] = set()
        threading.Thread(target=self._read, daemon=True).start()
        self._reply("serving", timeout=120)

    def _read(self) -> None:
        for raw in self.proc.stdout:
            msg = json.loads(raw)
            if msg["pid"] == self.proc.pid:
                self._replies.put(msg)
                continue
            with self._cond:
                self._events.setdefault(msg["pid"], []).append(msg)
                self._cond.notify_all()
        self._replies.put({"event": "eof"})

    def _reply(self, event: str, timeout: float | None = None) -> dict:
        try:
            msg = self._replies.get(timeout=timeout or self.timeout)
        except queue.Empty:
            raise self._fail(f"fork server sent no {event!r} in time") from None
        if msg["event"] != event:
            raise self._fail(f"fork server answered {msg} instead of {event!r}")
        return msg

    def _send(self, **cmd: Any) -> None:
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()

    def stderr_tail(self, n: int = 4000) -> str:
        self._stderr.flush()
        with open(self.stderr_path, "rb") as f:
            return f.read().decode(errors="replace")[-n:]

    def _fail(self, what: str) -> WorkerError:
        for pid in list(self._alive):
            self.kill(pid)
        return WorkerError(f"{what}\n--- worker stderr ---\n{self.stderr_tail()}")

    def spawn(self, *argv: Any) -> int:
        """Start ``workers.py <argv>`` as a forked worker; return its pid."""
        self._send(op="spawn", argv=[str(a) for a in argv])
        pid = self._reply("spawned")["child"]
        self._alive.add(pid)
        return pid

    def events(self, pid: int, event: str | None = None) -> list[dict]:
        with self._cond:
            return [m for m in self._events.get(pid, []) if event in (None, m["event"])]

    def wait_event(self, pid: int, event: str, timeout: float | None = None) -> dict:
        deadline = time.monotonic() + (timeout or self.timeout)
        with self._cond:
            while not (hits := [m for m in self._events.get(pid, []) if m["event"] == event]):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._fail(f"worker {pid} sent no {event!r} event in time; it sent "
                                     f"{self._events.get(pid, [])}")
                self._cond.wait(left)
            return hits[0]

    def kill(self, pid: int) -> None:
        """SIGKILL a worker this server forked (already gone is fine)."""
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait(self, pid: int, timeout: float | None = None) -> int:
        """Reap a worker; returns its exit code (``-9`` after SIGKILL)."""
        if pid not in self._alive:
            raise ValueError(f"{pid} is not a running worker of this server")
        timer = threading.Timer(timeout or self.timeout, self.kill, (pid,))
        timer.start()
        try:
            self._send(op="wait", child=pid)
            code = self._reply("exited", timeout=(timeout or self.timeout) + 30)["returncode"]
        finally:
            timed_out = not timer.is_alive()
            timer.cancel()
            self._alive.discard(pid)
        if timed_out:
            raise self._fail(f"worker {pid} did not finish within {timeout or self.timeout} s")
        # the worker has exited: its last lines are in the pipe before the server's reply
        return code

    def run(self, *argv: Any, timeout: float | None = None) -> tuple[int, list[dict]]:
        """Spawn a worker, wait for it; returns (exit code, its events)."""
        pid = self.spawn(*argv)
        code = self.wait(pid, timeout)
        return code, self.events(pid)

    def close(self) -> None:
        for pid in list(self._alive):
            self.kill(pid)
            try:
                self.wait(pid, timeout=10)
            except WorkerError:
                pass
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (subprocess.TimeoutExpired, BrokenPipeError, OSError):
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._stderr.close()


def run_processes(argvs: list[list[Any]], timeout: float = 120.0) -> list[tuple[int, list[dict],
                                                                                   str]]:
    """Run independent ``python workers.py`` processes at once; [(exit code, events, stderr)]."""
    procs = [subprocess.Popen([sys.executable, WORKERS, *map(str, argv)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for argv in argvs]
    out = []
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=max(deadline - time.monotonic(), 1))
            out.append((p.returncode, [json.loads(x) for x in stdout.splitlines()],
                        stderr.decode(errors="replace")))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    return out


if __name__ == "__main__":
    sys.exit(main())
