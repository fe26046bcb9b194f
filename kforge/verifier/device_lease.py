"""Who may use the machine while a timing runs: host-wide reader-writer leases.

Two leases, each a lock file: the *host* (every job of every pipeline on this machine) and, for
GPU jobs, the *device* (per ``CUDA_VISIBLE_DEVICES``). Every job that does real work holds them
*shared* for its life (a stage process: generate, compile, verify, warm, profile, select; each
sandboxed worker job inside it), and a timing trades its shares for the *exclusive* leases for
exactly its timed window (``timing_window``), after its workers have started, built the
reference and loaded torch.compile's baseline beside the other jobs::

    verify / warm / build / generate ── shared ─────────────────────────────────────── end
    profile / select:  start, reference, compile, import ── shared ──┤ exclusive: timing ├ end

So preparation overlaps and no other job's work (a compile on the host: CI's Slurm test saw one
kernel no_gain at 1.73x locally and shipped at 3.56x through Slurm, jobs side by side; GPU work
of another verification) runs while a candidate and its baselines are timed.

Two ``flock`` files make it fair to the timing jobs (writer preference): a reader passes a
turnstile before taking its share, and a writer holds the turnstile while it waits, so new
readers queue behind it instead of starving it. A writer gives up its own share before it
waits (two timings each holding a share would otherwise wait for each other). The locks belong
to open file descriptions that close with the process: a killed job never leaves a lease held.
Inside one process the leases are one object per file (``process_lease``), counted, so a stage's
share and its workers' shares are one share, and the stage's timing can trade it.

``KFORGE_DEVICE_LOCK`` names the lock file of both leases (the tests' way in: one file), ``off``
turns them off. The default files are per user in the temp folder, so every pipeline on the
host shares them.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

ENV = "KFORGE_DEVICE_LOCK"


def lock_path(gpu: bool) -> Path | None:
    """The device lease's lock file for a job, or None when the job takes none (a CPU job, or
    leases off); with ``KFORGE_DEVICE_LOCK`` set, that file for every job."""
    chosen = os.environ.get(ENV, "")
    if chosen == "off":
        return None
    if chosen:
        return Path(chosen)
    if not gpu:
        return None
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "all").replace(",", "-") or "none"
    return Path(tempfile.gettempdir()) / f"kforge-device-{os.getuid()}-{devices}.lock"


def host_lock_path() -> Path | None:
    """The host lease's lock file (None: leases off). With ``KFORGE_DEVICE_LOCK`` set, that file."""
    chosen = os.environ.get(ENV, "")
    if chosen == "off":
        return None
    if chosen:
        return Path(chosen)
    return Path(tempfile.gettempdir()) / f"kforge-host-{os.getuid()}.lock"


def lock_paths(gpu: bool) -> list[Path]:
    """The leases a job takes, in the order it takes them (the host first, always)."""
    paths = [p for p in (host_lock_path(), lock_path(gpu)) if p is not None]
    return list(dict.fromkeys(paths))


class DeviceLease:
    """One holder's side of one lease: ``shared()``, then optionally ``exclusive()``, then
    ``release()``. An object is one holder: two objects on one file conflict as two processes
    do (the tests' way to be another process); a process's own jobs use ``process_lease``."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        self._turn = os.open(path.with_name(path.name + ".turn"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        self.mode = ""  # "", "shared" or "exclusive"
        self.shares = 0  # counted holds (process_lease): the file is unlocked when both reach 0
        self.windows = 0
        self.guard = threading.Lock()

    def shared(self) -> None:
        fcntl.flock(self._turn, fcntl.LOCK_EX)  # behind any timing job already waiting
        try:
            fcntl.flock(self._lock, fcntl.LOCK_SH)
        finally:
            fcntl.flock(self._turn, fcntl.LOCK_UN)
        self.mode = "shared"

    def exclusive(self) -> float:
        """Trade the share (if any) for the whole lease; returns the seconds it waited."""
        start = time.monotonic()
        if self.mode:
            fcntl.flock(self._lock, fcntl.LOCK_UN)  # a held share would block its own upgrade
        fcntl.flock(self._turn, fcntl.LOCK_EX)  # readers that come now wait behind us
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX)
        finally:
            fcntl.flock(self._turn, fcntl.LOCK_UN)
        self.mode = "exclusive"
        return time.monotonic() - start

    def release(self) -> None:
        for fd in (self._lock, self._turn):
            try:
                os.close(fd)  # closing drops the flock
            except OSError:
                pass
        self.mode = ""

    # counted holds (one object per file and process: process_lease)
    def hold(self) -> None:
        with self.guard:
            self.shares += 1
            if self.mode == "":
                self.shared()

    def unhold(self) -> None:
        with self.guard:
            self.shares -= 1
            if self.shares <= 0 and self.windows <= 0:
                fcntl.flock(self._lock, fcntl.LOCK_UN)
                self.mode = ""

    def open_window(self) -> float:
        with self.guard:
            self.windows += 1
            return self.exclusive() if self.mode != "exclusive" else 0.0

    def close_window(self) -> None:
        with self.guard:
            self.windows -= 1
            if self.windows <= 0:
                if self.shares > 0:
                    fcntl.flock(self._lock, fcntl.LOCK_SH)  # back to a share: downgrades in place
                    self.mode = "shared"
                else:
                    fcntl.flock(self._lock, fcntl.LOCK_UN)
                    self.mode = ""


_PROCESS: dict[Path, DeviceLease] = {}
_PROCESS_GUARD = threading.Lock()


def process_lease(path: Path) -> DeviceLease:
    """This process's one holder of the lease at ``path``."""
    with _PROCESS_GUARD:
        lease = _PROCESS.get(path)
        if lease is None:
            lease = _PROCESS[path] = DeviceLease(path)
        return lease


@contextmanager
def held(gpu: bool, *, exclusive: bool = False) -> Iterator[DeviceLease | None]:
    """This process's shares of the host lease and (``gpu``) the device lease for one job, or
    (``exclusive``) the whole machine from the start (a whole-run measurement: peaks, ncu).
    Yields the last lease taken (None when leases are off)."""
    leases = [process_lease(p) for p in lock_paths(gpu)]
    with ExitStack() as stack:
        for lease in leases:
            if exclusive:
                lease.open_window()
                stack.callback(lease.close_window)
            else:
                lease.hold()
                stack.callback(lease.unhold)
        yield leases[-1] if leases else None


@contextmanager
def timing_window(gpu: bool) -> Iterator[float]:
    """The machine to this timing alone: every lease of the job exclusive (the host's, then the
    device's), traded back to this process's shares afterwards; yields the seconds it waited."""
    leases = [process_lease(p) for p in lock_paths(gpu)]
    waited = 0.0
    with ExitStack() as stack:
        for lease in leases:
            waited += lease.open_window()
            stack.callback(lease.close_window)
        yield waited
