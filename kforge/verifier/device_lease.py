"""Who may use the GPU while a timing runs: a host-wide reader-writer lease.

Before this, a timing job owned the whole machine through Snakemake (all cores), so nothing
else ran while it timed, and also nothing ran while it started Python, built the reference,
and loaded torch.compile's baseline from the cache: ~12 s of a 15-22 s profile on the H100,
spent one problem at a time. Now every sandboxed job that uses the GPU holds the lease
*shared* for its worker's lifetime, and a timing job trades its share for the *exclusive*
lease at the moment its worker is about to import the candidate (``handshake.GATE``):

    verify / warm / reference / profile start ── shared ──────────────────────────── end
    profile:  start, reference, compile ── shared ──┤ exclusive: candidate, timing, checks ├ end

So trusted preparation overlaps (other profiles, verifications, warm-ups), and no other GPU
work runs while a candidate and its baselines are timed. Candidate code only ever runs in a
worker whose parent holds the lease: shared in a verification (nothing is timed then) or
exclusive in a timing job, so a candidate cannot run GPU work beside another one's timing.

Two ``flock`` files make it fair to the timing jobs (writer preference): a reader passes a
turnstile before taking its share, and a writer holds the turnstile while it waits, so new
readers queue behind it instead of starving it. The locks belong to open file descriptions
that close with the process: a killed job never leaves the lease held.

The lease is on for GPU jobs (``gpu=True``); ``KFORGE_DEVICE_LOCK`` names the lock file (a
CPU run uses it too when set: the tests' way in), ``off`` turns it off. The default file is
per user and per ``CUDA_VISIBLE_DEVICES`` in the temp folder, so every pipeline on the host
that uses the same devices shares it.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ENV = "KFORGE_DEVICE_LOCK"


def lock_path(gpu: bool) -> Path | None:
    """The lease's lock file for a job, or None when the job takes no lease."""
    chosen = os.environ.get(ENV, "")
    if chosen == "off":
        return None
    if chosen:
        return Path(chosen)
    if not gpu:
        return None
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "all").replace(",", "-") or "none"
    return Path(tempfile.gettempdir()) / f"kforge-device-{os.getuid()}-{devices}.lock"


class DeviceLease:
    """One holder's side of the lease: ``shared()``, then optionally ``exclusive()``, then
    ``release()`` (or use :func:`held`)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        self._turn = os.open(path.with_name(path.name + ".turn"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        self.mode = ""  # "", "shared" or "exclusive"

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


@contextmanager
def held(gpu: bool, *, exclusive: bool = False) -> Iterator[DeviceLease | None]:
    """The lease for one job (None when it takes none): shared, or ``exclusive`` from the start
    (a whole-run measurement: peaks, ncu)."""
    path = lock_path(gpu)
    if path is None:
        yield None
        return
    lease = DeviceLease(path)
    try:
        if exclusive:
            lease.exclusive()
        else:
            lease.shared()
        yield lease
    finally:
        lease.release()
