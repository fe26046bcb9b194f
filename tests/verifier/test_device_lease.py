"""The device lease (kforge/verifier/device_lease.py): a timing has the device to itself, other
GPU jobs share it, a waiting timing is not starved, and the wait is not the worker's time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kforge.verifier.device_lease import DeviceLease, held, lock_path
from kforge.verifier.profiling import profile_candidate

from .conftest import HONEST, SCALE_TANH

pytestmark = pytest.mark.exclusive  # timings or wall-clock bounds: alone under xdist (tests/conftest.py)


def _hold_in_child(path: Path, mode: str, seconds: float) -> subprocess.Popen[bytes]:
    """Another process that takes the lease (``shared`` or ``exclusive``), says so on stdout,
    and holds it for ``seconds``."""
    code = (
        "import sys, time; from pathlib import Path; from kforge.verifier.device_lease import DeviceLease\n"
        f"lease = DeviceLease(Path({str(path)!r})); lease.{mode}(); print('held', flush=True)\n"
        f"time.sleep({seconds}); lease.release()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline().strip() == b"held"
    return child


def test_exclusive_waits_for_every_share_and_shares_wait_for_it(tmp_path: Path) -> None:
    path = tmp_path / "device.lock"
    child = _hold_in_child(path, "shared", 1.5)
    other = DeviceLease(path)
    other.shared()  # shares coexist
    assert other.mode == "shared"
    start = time.monotonic()
    waited = other.exclusive()  # trades its own share; waits for the child's
    assert waited >= 1.0 and time.monotonic() - start >= 1.0
    assert child.wait(timeout=10) == 0
    reader_got = threading.Event()

    def reader() -> None:
        lease = DeviceLease(path)
        lease.shared()
        reader_got.set()
        lease.release()

    t = threading.Thread(target=reader)
    t.start()
    assert not reader_got.wait(0.5), "a share was granted while the lease was exclusive"
    other.release()
    assert reader_got.wait(5)
    t.join()


def test_a_waiting_timing_is_served_before_later_shares(tmp_path: Path) -> None:
    path = tmp_path / "device.lock"
    first = _hold_in_child(path, "shared", 1.0)
    order: list[str] = []
    writer = DeviceLease(path)

    def take_exclusive() -> None:
        writer.exclusive()
        order.append("exclusive")
        time.sleep(0.3)
        writer.release()

    w = threading.Thread(target=take_exclusive)
    w.start()
    time.sleep(0.3)  # the writer is waiting for the child's share now

    def late_reader() -> None:
        lease = DeviceLease(path)
        lease.shared()
        order.append("late share")
        lease.release()

    r = threading.Thread(target=late_reader)
    r.start()
    w.join(10)
    r.join(10)
    assert first.wait(timeout=10) == 0
    assert order == ["exclusive", "late share"]


def test_a_killed_holder_leaves_the_lease_free(tmp_path: Path) -> None:
    path = tmp_path / "device.lock"
    child = _hold_in_child(path, "exclusive", 60)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    lease = DeviceLease(path)
    done = threading.Event()
    threading.Thread(target=lambda: (lease.shared(), done.set()), daemon=True).start()
    assert done.wait(5), "a killed process still held the lease"
    lease.release()


def test_which_jobs_take_the_lease(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KFORGE_DEVICE_LOCK", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert lock_path(gpu=False) is None  # a CPU job takes none unless asked
    gpu_path = lock_path(gpu=True)
    assert gpu_path is not None and gpu_path.name == f"kforge-device-{os.getuid()}-2-3.lock"
    monkeypatch.setenv("KFORGE_DEVICE_LOCK", "off")
    assert lock_path(gpu=True) is None
    monkeypatch.setenv("KFORGE_DEVICE_LOCK", str(tmp_path / "x.lock"))
    assert lock_path(gpu=False) == tmp_path / "x.lock"
    with held(False) as lease:
        assert lease is not None and lease.mode == "shared"
    with held(False, exclusive=True) as lease:
        assert lease is not None and lease.mode == "exclusive"


def test_a_profile_times_only_with_the_device_to_itself(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Another job holds a share (a verification, say) for 12 s: the profile's worker starts and
    prepares beside it, then waits at the gate before the candidate's import; the wait is
    recorded and not counted against the worker's 8 s timeout (it would have timed out)."""
    path = tmp_path / "device.lock"
    monkeypatch.setenv("KFORGE_DEVICE_LOCK", str(path))
    holder = _hold_in_child(path, "shared", 12)
    try:
        start = time.monotonic()
        prof = profile_candidate(HONEST, SCALE_TANH, platform="cpu", reps=10, threads=1, timeout_s=8)
        took = time.monotonic() - start
    finally:
        holder.kill()
        holder.wait()
    assert prof.ok, (prof.reason, prof.detail)
    waited = float(prof.extra["device_wait_s"])
    assert waited > 3.0 and took > 10.0, (waited, took)  # it did wait for the holder's share
    assert prof.candidate is not None and prof.candidate.reps == 10
