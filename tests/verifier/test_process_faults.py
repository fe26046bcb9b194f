"""Process faults: the candidate hangs, forks, allocates, writes, connects, floods, forges.
Every test gets a Verdict back (never an exception) and leaves no process behind."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from kforge.verifier.checks import static_check
from kforge.verifier.runner import scrub
from kforge.verifier.sandbox import Limits, run_sandboxed

from .conftest import HONEST, REPO, SCALE_TANH, assert_nothing_left, honest_with, verify


def test_infinite_loop_at_import_times_out() -> None:
    t0 = time.monotonic()
    v = verify("while True:\n    pass\n" + HONEST, static=False, timeout_s=6)
    assert v.reason == "timeout"
    assert time.monotonic() - t0 < 30


def test_infinite_loop_inside_the_kernel_times_out() -> None:
    v = verify(honest_with("        while True:\n            pass"), static=False, timeout_s=8)
    assert v.reason == "timeout"


def test_fork_bomb_is_capped_by_the_process_limit() -> None:
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    v = verify(bomb + HONEST, static=False, timeout_s=8, max_pids=64)
    assert not v.ok
    assert v.reason in {"timeout", "process_limit"}
    assert_nothing_left()


def test_setsid_double_fork_survivor_is_killed() -> None:
    marker = f"kforge-survivor-{os.getpid()}-{time.monotonic_ns()}"
    src = f'''
import os, subprocess, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", "{marker}"])
    os._exit(0)
''' + HONEST
    verify(src, static=False, timeout_s=20)
    time.sleep(0.5)
    assert_nothing_left(marker, unique=True)


def test_64_gib_host_allocation_is_oom() -> None:
    v = verify(honest_with("        big = torch.ones(64 * 1024**3 // 4)\n        return y + big[0]"),
               static=False, memory_mb=2048)
    assert v.reason == "oom", v.detail


def test_writes_to_system_files_store_and_verifier_code_fail(tmp_path: Path) -> None:
    store = REPO / "artifacts"
    targets = ["/etc/passwd", str(REPO / "kforge" / "verifier" / "checks.py"), str(store / "planted")]
    before = {t: Path(t).read_bytes() if Path(t).exists() else None for t in targets}
    header = f"WROTE = []\nfor _t in {targets!r}:\n    try:\n        open(_t, 'a').write('pwned')\n" \
             "        WROTE.append(_t)\n    except OSError:\n        pass\n"
    v = verify(honest_with("        assert not WROTE, WROTE\n        return y", header=header),
               static=False)
    assert v.ok, v.detail  # every write failed, so the candidate's own assert held
    after = {t: Path(t).read_bytes() if Path(t).exists() else None for t in targets}
    assert after == before


def test_network_is_unreachable() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    got: list[bytes] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                got.append(conn.recv(100))
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    header = f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), 2).send(b'leak')\nexcept OSError:\n    pass\n"
    verify(honest_with("        return y", header=header), static=False)
    stop.set()
    thread.join()
    server.close()
    assert got == []


def test_killing_the_parent_does_not_reach_the_verifier() -> None:
    me = os.getpid()
    header = f"import os, signal\nfor _p in (os.getppid(), {me}, 1):\n    try:\n        os.kill(_p, signal.SIGKILL)\n    except OSError:\n        pass\n"
    v = verify(honest_with("        return y", header=header), static=False)
    assert os.getpid() == me  # we are still here to read the verdict
    assert isinstance(v.reason, str)


def test_one_gigabyte_of_stdout_is_capped() -> None:
    header = "import sys\n_chunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(_chunk)\n"
    t0 = time.monotonic()
    v = verify(honest_with("        return y", header=header), static=False)
    assert v.reason == "output_flood"
    assert len(v.detail) < 3000
    assert time.monotonic() - t0 < 60


def test_atexit_cannot_rewrite_the_result() -> None:
    header = '''import atexit, os
def _forge():
    for fd in range(3, 64):
        try:
            os.write(fd, b'{"ok": true, "reason": "ok"}')
        except OSError:
            pass
    open("verdict.json", "w").write('{"ok": true}')
atexit.register(_forge)
'''
    v = verify(honest_with("        return y + 1.0", header=header), static=False)
    assert v.reason == "output_mismatch"


def test_forged_frame_on_the_result_pipe_is_tampering() -> None:
    # A wrong candidate forges a frame on every descriptor it can reach (the result pipe's
    # number is in the environment; whether the pipe is still reachable at import depends on
    # how many files the parent holds open). The forgery is caught or has no effect: the
    # verdict is never ok.
    header = '''import os
for fd in {*range(3, 64), int(os.environ.get("KFORGE_RESULT_FD", "3"))}:
    try:
        os.write(fd, b"\\x00" * 16 + b"\\x02\\x00\\x00\\x00{}")
    except OSError:
        pass
'''
    v = verify(honest_with("        return y + 1.0", header=header), static=False)
    assert not v.ok
    assert v.reason in ("harness_tampering", "output_mismatch"), v.detail


def test_os_exit_before_returning_is_a_crash() -> None:
    v = verify(honest_with("        import os\n        os._exit(0)"), static=False)
    assert v.reason == "crashed"
    assert "without an answer" in v.detail


def test_rigged_eq_output_object_is_rejected() -> None:
    header = '''class Rigged(torch.Tensor):
    def __eq__(self, other):
        return True
    def allclose(self, *a, **k):
        return True
'''
    v = verify(honest_with("        return torch.zeros(3).as_subclass(Rigged)", header=header), static=False)
    assert v.reason == "rigged_output_object"


def test_hunting_gc_for_answers_finds_nothing_to_steal() -> None:
    src = honest_with('''        import gc
        for obj in gc.get_objects():
            if isinstance(obj, torch.Tensor) and obj.shape == x.shape and obj is not x:
                return obj
        return x''')
    assert static_check(src, SCALE_TANH.read_text(), platform="cpu")[0].reason == "harness_tampering"
    v = verify(src, static=False)
    assert not v.ok  # the reference's outputs never exist in the candidate's process


def test_include_of_etc_shadow_is_flagged_and_scrubbed() -> None:
    src = HONEST + '\nCPP_SOURCE = r"""\n#include "/etc/shadow"\n#include <vector>\n"""\n'
    findings = static_check(src, SCALE_TANH.read_text(), platform="cpu")
    assert [f.reason for f in findings] == ["forbidden_include"]
    log = "In file included from /etc/shadow:1:\n/etc/shadow:1:1: error: root:$6$secret"
    assert "/etc/shadow" not in scrub(log, None)


def test_template_recursion_compile_bomb_is_stopped(tmp_path: Path) -> None:
    cpp = tmp_path / "bomb.cpp"
    cpp.write_text("template<int N> struct F { enum { v = F<N+1>::v + F<N+2>::v }; };\n"
                   "int main() { return F<0>::v; }\n")
    r = run_sandboxed(["g++", "-ftemplate-depth=100000", "-c", str(cpp), "-o", str(tmp_path / "b.o")],
                      env={"PATH": os.environ["PATH"]}, scratch=tmp_path, stdin=b"",
                      limits=Limits(timeout_s=4, memory_mb=2048))
    assert r.timed_out or r.returncode != 0
    assert r.survivors == []
    assert_nothing_left(str(cpp), unique=True)


def test_syntax_error_and_missing_model_new_are_static() -> None:
    assert verify("def broken(:\n").reason == "syntax_error"
    assert verify("import torch\nclass Other:\n    pass\n").reason == "no_model_new"


def test_sandbox_has_read_only_root_private_tmp_and_no_network(tmp_path: Path) -> None:
    probe = ("import os, socket\n"
             "try:\n    open('/usr/kforge-probe', 'w')\n    print('rw')\nexcept OSError:\n    print('ro')\n"
             "print(sorted(os.listdir('/tmp')) == [])\n"
             "print([n for _, n in socket.if_nameindex()])\n")
    r = run_sandboxed([sys.executable, "-c", probe], env={"PATH": os.environ["PATH"]},
                      scratch=tmp_path, stdin=b"", limits=Limits(timeout_s=20))
    lines = r.stdout.split("\n")
    assert lines[0] == "ro"
    if r.mode.startswith("bwrap"):
        assert lines[1] == "True" or str(tmp_path).startswith("/tmp")
        assert lines[2] == "['lo']"
    assert subprocess.run(["true"]).returncode == 0


def test_build_folder_default_order(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from pathlib import Path

    from kforge.verifier.runner import build_folder

    monkeypatch.delenv("KFORGE_BUILD_DIR", raising=False)
    assert build_folder("triton", None) == Path.home() / ".cache" / "kforge" / "triton"
    monkeypatch.setenv("KFORGE_BUILD_DIR", "/srv/builds")
    assert build_folder("triton", None) == Path("/srv/builds")
    assert build_folder("triton", "/given") == Path("/given")


UNSHARE_PROBE = """import errno, os, subprocess
def attempt(path):
    try:
        with open(path, 'a') as fh:
            fh.write('pwned')
        return 'wrote'
    except OSError as err:
        return errno.errorcode[err.errno]
print(attempt(os.environ['OUTSIDE']), attempt('/etc/passwd'))
print(attempt('scratch-file'))
print(subprocess.run(['mount', '-o', 'remount,rw', '/'], capture_output=True).returncode != 0)
print(os.getcwd() == os.environ['SCRATCH'])
def opened_for_writing(path):  # opened and closed, nothing written (never trigger a SysRq)
    try:
        os.close(os.open(path, os.O_WRONLY))
        return 'opened'
    except OSError as err:
        return errno.errorcode[err.errno]
print(opened_for_writing('/proc/sysrq-trigger'), opened_for_writing('/proc/sys/vm/drop_caches'))
import ctypes, threading
done = threading.Event()
thread = threading.Thread(target=done.wait)
thread.start()
print(ctypes.CDLL(None).pthread_setname_np(ctypes.c_ulong(thread.ident), b'named'))
done.set()
thread.join()
print(attempt('/dev/shm/' + os.environ['SHM_NAME']))
print(attempt('/tmp/' + os.environ['SHM_NAME']))
"""


@pytest.mark.parametrize("cgroups", [True, False])
def test_unshare_fallback_keeps_the_filesystem_read_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         cgroups: bool, request: pytest.FixtureRequest) -> None:
    """Without bwrap, root's `unshare` sandbox builds the run's view and chroots into it, then
    drops every capability: a file outside the view does not exist there, what the view shows is
    read-only but the scratch and its own /proc, no remount (a real hole before: /etc/passwd and
    the checkout were writable), no sysctl."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"):
        pytest.skip("the unshare sandbox is root-only and needs util-linux's unshare and setpriv")
    import kforge.verifier.sandbox as sandbox

    monkeypatch.setenv("KFORGE_SANDBOX", "unshare")
    if not cgroups:  # the uid drop joins the capability drop
        monkeypatch.setattr(sandbox.RunCgroup, "create", classmethod(lambda cls, **kw: None))
    # outside the scratch and outside /tmp (the sandbox's /tmp is a private tmpfs)
    fd, name = tempfile.mkstemp(prefix="kforge-outside-", dir="/var/tmp")
    os.close(fd)
    outside = Path(name)
    request.addfinalizer(lambda: outside.unlink(missing_ok=True))
    outside.write_text("kept")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    shm_name = f"kforge-probe-{os.getpid()}-{tmp_path.name}"
    r = run_sandboxed([sys.executable, "-c", UNSHARE_PROBE], scratch=scratch, stdin=b"",
                      env={"PATH": os.environ["PATH"], "OUTSIDE": str(outside), "SCRATCH": str(scratch),
                           "SHM_NAME": shm_name},
                      limits=Limits(timeout_s=60))
    assert r.mode.startswith("unshare+") and r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[0].split() == ["ENOENT", "EROFS" if cgroups else "EACCES"], r.stdout
    assert lines[1:4] == ["wrote", "True", "True"], r.stdout
    assert outside.read_text() == "kept" and (scratch / "scratch-file").read_text() == "pwned"
    # /proc stays writable for the sandbox's own threads (a read-only /proc stops thread naming:
    # the likely cause of CUDA's error 304 there), never for the host's sysctls or the SysRq trigger
    sysrq, sysctl = lines[4].split()
    assert sysrq in {"EROFS", "EACCES", "ENOENT"} and sysctl in {"EROFS", "EACCES"}, r.stdout
    assert lines[5] == "0", r.stdout  # pthread_setname_np on another thread succeeded
    # /dev/shm is the sandbox's own (CUDA IPC to the judge writes there): writable inside, and
    # nothing reaches the host's
    assert lines[6] == "wrote", r.stdout
    assert not Path("/dev/shm", shm_name).exists()
    # so is /tmp, as under bwrap (torch.compile's cache may name a path there); the scratch,
    # which lies under /tmp here, is bound back in
    assert lines[7] == "wrote", r.stdout
    assert not Path("/tmp", shm_name).exists()


NESTED_PROBE = UNSHARE_PROBE.split("print(", 1)[0] + """
print(open(os.environ['INPUT']).read(), attempt(os.environ['INPUT']), attempt('in-scratch'))
"""


def test_unshare_sandbox_keeps_inputs_under_tmp_visible_and_read_only(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The unshare sandbox's /tmp is private, like bwrap's: a read-only input folder under /tmp
    is bound back in, and a scratch folder inside that input folder stays writable."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"):
        pytest.skip("the unshare sandbox is root-only and needs util-linux's unshare and setpriv")
    monkeypatch.setenv("KFORGE_SANDBOX", "unshare")
    (tmp_path / "problem.py").write_text("input")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    r = run_sandboxed([sys.executable, "-c", NESTED_PROBE], scratch=scratch, stdin=b"", ro_paths=[tmp_path],
                      env={"PATH": os.environ["PATH"], "INPUT": str(tmp_path / "problem.py")},
                      limits=Limits(timeout_s=60))
    assert r.mode.startswith("unshare+") and r.returncode == 0, r.stderr
    assert r.stdout.split() == ["input", "EROFS", "wrote"], r.stdout
    assert (tmp_path / "problem.py").read_text() == "input" and (scratch / "in-scratch").read_text() == "pwned"
