"""Run one untrusted worker process under every limit this host can enforce.

Layers, strongest available first (the chosen combination is recorded as ``mode``)::

    isolation   bwrap   the run's view (sandbox_view.py: the system, the interpreter, the
                        package, the job's inputs, read-only; a private /tmp; the scratch
                        read-write; nothing else), no network, own PID namespace (escaped
                        grandchildren die with it), die-with-parent
                unshare  util-linux unshare (root only): the same view built in a new mount
                        namespace and chrooted into (ro_mounts.py), no network, own PID
                        namespace, no capabilities
                setsid   own session / process group only
    limits      cgroup   pids.max (holds as root) + memory cap + kill-by-group
                uid      drop to nobody with RLIMIT_NPROC (root without cgroups)
                rlimit   RLIMIT_NPROC as an unprivileged user
    always      wall-clock limit, RLIMIT_DATA (never RLIMIT_AS: it breaks CUDA), RLIMIT_CORE=0,
                stdout/stderr capped, results over a private pipe read by the parent

Nothing the child writes is trusted: the parent reads the pipe, parses it, and writes records.
After every run, whatever happened, every process of the run is killed.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from kforge.verifier.cgroups import RunCgroup
from kforge.verifier.sandbox_view import View, build_view

NOBODY = 65534


class Companion(Protocol):
    """A parent-side helper that talks to the child over pipes of its own."""

    @property
    def pass_fds(self) -> tuple[int, ...]: ...

    def env(self) -> dict[str, str]: ...

    def started(self, root_pid: int) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 120.0
    memory_mb: int | None = 4096
    max_pids: int = 256  # threads count too: torch starts one per core
    keep_output: int = 16 * 1024  # head and tail kept of stdout/stderr, each
    flood_bytes: int = 256 * 1024 * 1024  # stdout+stderr beyond this kills the run
    result_bytes: int = 1536 * 1024 * 1024


@dataclass
class SandboxResult:
    returncode: int | None
    timed_out: bool
    oom: bool
    pids_limited: bool
    output_flood: bool
    stdout: str
    stderr: str
    result: bytes
    result_overflow: bool
    mode: str
    seconds: float
    survivors: list[int] = field(default_factory=list)

    @property
    def signal(self) -> int | None:
        return -self.returncode if self.returncode is not None and self.returncode < 0 else None


class _Capture(threading.Thread):
    """Drain one pipe: keep the head and the tail, count everything."""

    def __init__(self, fd: int, keep: int, on_flood: threading.Event, flood: int, raw: bool):
        super().__init__(daemon=True)
        self.fd, self.keep, self.flood, self.raw = fd, keep, flood, raw
        self.on_flood = on_flood
        self.head = bytearray()
        self.tail = bytearray()
        self.chunks: list[bytes] = []
        self.total = 0
        self.overflow = False

    def run(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            self.total += len(chunk)
            if self.raw:
                if self.total <= self.flood:
                    self.chunks.append(chunk)
                elif not self.overflow:
                    self.overflow = True
                    self.on_flood.set()
                continue
            if len(self.head) < self.keep:
                self.head.extend(chunk[: self.keep - len(self.head)])
            self.tail.extend(chunk)
            if len(self.tail) > 2 * self.keep:
                del self.tail[: len(self.tail) - self.keep]
            if self.total > self.flood and not self.overflow:
                self.overflow = True
                self.on_flood.set()
        os.close(self.fd)

    def text(self) -> str:
        if self.total <= len(self.head):
            data = bytes(self.head)
        elif self.total <= len(self.head) + self.keep:
            data = bytes(self.head) + bytes(self.tail[-(self.total - len(self.head)) :])
        else:
            skipped = self.total - len(self.head) - min(len(self.tail), self.keep)
            data = bytes(self.head) + f"\n[... {skipped} bytes cut ...]\n".encode() + bytes(
                self.tail[-self.keep :]
            )
        return data.decode("utf-8", "replace")


def _bwrap_works() -> bool:
    exe = shutil.which("bwrap")
    if exe is None:
        return False
    try:
        probe = [exe, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--unshare-net",
                 "--unshare-pid", "--die-with-parent", "--", "/bin/true"]
        return subprocess.run(probe, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


_BWRAP_OK: bool | None = None


def isolation_available() -> str:
    """The strongest isolation this host offers: "bwrap", "unshare" or "setsid"."""
    global _BWRAP_OK
    if os.environ.get("KFORGE_SANDBOX") in {"bwrap", "unshare", "setsid"}:
        return os.environ["KFORGE_SANDBOX"]
    if _BWRAP_OK is None:
        _BWRAP_OK = _bwrap_works()
    if _BWRAP_OK:
        return "bwrap"
    if os.geteuid() == 0 and shutil.which("unshare") and shutil.which("setpriv"):
        return "unshare"
    return "setsid"


def _wrap(argv: list[str], isolation: str, *, view: View, drop_uid: bool) -> list[str]:
    to_nobody = [f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] if drop_uid else []
    if isolation == "unshare":  # root: the view built in a new mount namespace, then no capabilities
        no_caps = ["--bounding-set", "-all", "--inh-caps", "-all", "--no-new-privs"]
        return ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc",
                sys.executable, "-I", str(Path(__file__).with_name("ro_mounts.py")), view.to_json(), "--",
                "setpriv", *to_nobody, *no_caps, "--", *argv]
    tail = ["setpriv", *to_nobody, "--", *argv] if drop_uid else list(argv)
    if isolation == "bwrap":
        return ["bwrap", *view.bwrap_args(), "--unshare-net", "--unshare-pid", "--unshare-ipc",
                "--unshare-uts", "--die-with-parent", "--new-session", "--", *tail]
    return tail


def tool_dirs(argv: list[str]) -> list[Path]:
    """Where the programs a run starts live, when that is outside the system folders (a
    profiler installed under /opt): their folders are part of the view."""
    found = []
    for arg in argv:
        if arg.startswith("/") and Path(arg).is_file() and os.access(arg, os.X_OK):
            found.append(Path(arg).resolve().parent)
    return found


def run_sandboxed(argv: list[str], *, env: dict[str, str], scratch: Path, stdin: bytes,
                  limits: Limits, ro_paths: list[Path] | None = None,
                  gpu: bool = False, companion: Companion | None = None,
                  hide: list[str] | None = None) -> SandboxResult:
    """Run ``argv`` (a python worker) sandboxed; ``stdin`` is its whole job description.
    ``companion`` (``handshake.CallTimer``) gets pipes into the child and the child's pid. The
    run sees its view (``sandbox_view.py``): ``ro_paths`` read-only, ``hide`` (libraries) not at all."""
    isolation = isolation_available()
    cgroup = RunCgroup.create(max_pids=limits.max_pids, memory_mb=limits.memory_mb)
    root = os.geteuid() == 0
    drop_uid = cgroup is None and root and shutil.which("setpriv") is not None
    limit_mode = "cgroup" if cgroup else ("uid" if drop_uid else "rlimit")
    if drop_uid:
        os.chown(scratch, NOBODY, NOBODY)
    mode = f"{isolation}+{limit_mode}"
    procs_files = cgroup.procs_files() if cgroup else []
    memory_mb = limits.memory_mb
    max_pids = limits.max_pids

    def preexec() -> None:  # runs in the child between fork and exec: no allocation-heavy work
        for f in procs_files:
            with open(f, "w") as fh:
                fh.write(str(os.getpid()))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if memory_mb is not None:
            cap = memory_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
        if limit_mode != "cgroup":
            resource.setrlimit(resource.RLIMIT_NPROC, (max_pids, max_pids))

    read_res, write_res = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe()
    flood = threading.Event()
    captures = [
        _Capture(out_r, limits.keep_output, flood, limits.flood_bytes, raw=False),
        _Capture(err_r, limits.keep_output, flood, limits.flood_bytes, raw=False),
        _Capture(read_res, 0, flood, limits.result_bytes, raw=True),
    ]
    imports = [Path(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    view = build_view(scratch=scratch, ro_paths=[*(ro_paths or []), *tool_dirs(argv)], gpu=gpu,
                      hide=hide or [], import_dirs=imports)
    cmd = _wrap(argv, isolation, view=view, drop_uid=drop_uid)
    full_env = {**env, "KFORGE_RESULT_FD": str(write_res), **(companion.env() if companion else {})}
    start = time.monotonic()
    proc: subprocess.Popen[bytes] | None = None
    try:
        proc = subprocess.Popen(
            cmd, stdin=in_r, stdout=out_w, stderr=err_w, env=full_env, cwd=str(scratch),
            start_new_session=True, preexec_fn=preexec, close_fds=True,
            pass_fds=(write_res, *(companion.pass_fds if companion else ())),
        )
    finally:
        for fd in (out_w, err_w, in_r, write_res):
            os.close(fd)
        if companion is not None:
            companion.started(proc.pid if proc is not None else 0)
    for c in captures:
        c.start()
    writer = threading.Thread(target=_feed, args=(in_w, stdin), daemon=True)
    writer.start()
    timed_out = False
    deadline = start + limits.timeout_s
    while True:
        if proc.poll() is not None:
            break
        # time the worker spent waiting for the device to itself is not its own (device_lease.py)
        if flood.is_set() or time.monotonic() > deadline + float(getattr(companion, "waited_s", 0.0)):
            timed_out = not flood.is_set()
            break
        time.sleep(0.01)
    _kill_run(proc, cgroup)
    if companion is not None:
        companion.close()
    seconds = time.monotonic() - start
    for c in captures:
        c.join(timeout=5)
    survivors = _survivors(proc.pid, cgroup)
    oom = bool(cgroup and cgroup.hit_memory_limit())
    pids_limited = bool(cgroup and cgroup.hit_pids_limit())
    if cgroup:
        cgroup.remove()
    out, err, res = captures
    return SandboxResult(
        returncode=proc.returncode, timed_out=timed_out, oom=oom, pids_limited=pids_limited,
        output_flood=out.overflow or err.overflow, stdout=out.text(), stderr=err.text(),
        result=b"".join(res.chunks), result_overflow=res.overflow, mode=mode, seconds=seconds,
        survivors=survivors,
    )


def _feed(fd: int, data: bytes) -> None:
    try:
        _write_all(fd, data)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _kill_run(proc: subprocess.Popen[bytes], cgroup: RunCgroup | None) -> None:
    """Kill the process group (bwrap's PID namespace dies with its init), then the cgroup."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    if cgroup:
        cgroup.kill_all()


def _survivors(pid: int, cgroup: RunCgroup | None) -> list[int]:
    if cgroup:
        return cgroup.pids()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            pgid = int(stat.rsplit(")", 1)[1].split()[2])
        except (OSError, ValueError, IndexError):
            continue
        if pgid == pid:
            found.append(int(entry.name))
    return found


def python_argv(module: str) -> list[str]:
    return [sys.executable, "-m", module]
