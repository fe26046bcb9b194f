"""Timing a candidate cannot forge on the CPU: the trusted parent clocks every timed call.

    worker (sandboxed, runs candidate code)          parent (trusted)
    ── TICK(fn, rep) ──────────────────────────────> read the worker's CPU time, start clock
    <───────────────────────────────────────── GO ──
       call fn (its own clock around the call)
    ── DONE(fn, rep, claimed ns) ──────────────────> stop clock, read the worker's CPU time

The parent's wall time of a call is the claim plus two pipe hops, which the worker measures
first with empty calls (``NULL``). The parent reads the worker's CPU time from
``/proc/<pid>/task/*/schedstat`` (nanoseconds, every thread; ``/proc/<pid>/stat`` ticks where
schedstat is missing). :func:`consistency` rejects, as ``timing_inconsistent``, a candidate
whose claims fall short of the parent's clock beyond the measured hop noise, or that burned
more CPU in its calls than its thread count allows; the parent's records, not the worker's
report, become the timing. Whatever the candidate does inside its process (a replaced clock,
a patched timing module) cannot move the parent's clock.
"""

from __future__ import annotations

import os
import statistics
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MSG = struct.Struct("<BBxxIQ")  # kind, callable index, rep, claimed ns
TICK, DONE = 1, 2
NAMES = ("candidate", "eager", "compiled", "null")
ENV = "KFORGE_CLOCK_FDS"
WORKER_MARK = b"kforge.verifier.worker_main"
NULL_CALLS = 15
GAP_SHARE = 0.25  # claims may fall short of the parent's clock by this share of the call ...
GAP_FLOOR_NS = 100_000  # ... plus the hop's spread plus this
CPU_SLACK = 1.25  # CPU time may exceed threads x wall by this factor (scheduler accounting)


@dataclass
class Call:
    name: str
    rep: int
    wall_ns: int  # the parent's clock: GO sent .. DONE read
    claimed_ns: int
    cpu_ns: int  # the worker's CPU time (all threads) between the parent's two reads
    cpu_wall_ns: int  # the parent's clock between those two reads


@dataclass
class CallTimer:
    """Parent side: the pipes, the serving thread and the calls it recorded."""

    threads: int | None = None  # the worker's pinned thread count (``timing.pin_cpu``)
    calls: list[Call] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    cpu_source: str = ""

    def __post_init__(self) -> None:
        self._up_r, self._up_w = os.pipe()  # worker -> parent
        self._down_r, self._down_w = os.pipe()  # parent -> worker
        self._thread: threading.Thread | None = None

    @property
    def pass_fds(self) -> tuple[int, int]:
        return self._up_w, self._down_r

    def env(self) -> dict[str, str]:
        return {ENV: f"{self._up_w},{self._down_r}"}

    def started(self, root_pid: int) -> None:
        os.close(self._up_w)
        os.close(self._down_r)
        self._thread = threading.Thread(target=self._serve, args=(root_pid,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=5)
        for fd in (self._up_r, self._down_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _serve(self, root_pid: int) -> None:
        # Off the worker's cores (it pins to the first ``threads`` of the same set): sharing
        # its core, this thread ran between the worker's calls and cooled its caches (the honest
        # control timed 2-3x slower). Linux applies this to the calling thread only.
        cores = sorted(os.sched_getaffinity(0))
        spare = cores[max(1, min(self.threads or len(cores), len(cores))):]
        if spare:
            os.sched_setaffinity(0, spare)
        pid = 0
        pending: tuple[int, int, int, int, int] | None = None
        while True:
            data = _read_exact(self._up_r, MSG.size)
            if data is None:
                return
            kind, index, rep, claimed = MSG.unpack(data)
            if kind == TICK and pending is None and index < len(NAMES):
                if not pid:
                    pid = find_worker(root_pid)
                    self.cpu_source = "schedstat" if _schedstat_ns(pid) is not None else "stat"
                tc0 = time.perf_counter_ns()
                cpu0 = cpu_ns(pid)
                t0 = time.perf_counter_ns()
                try:
                    os.write(self._down_w, b"g")
                except OSError:
                    return
                pending = (index, rep, t0, tc0, cpu0)
            elif kind == DONE and pending is not None and (index, rep) == pending[:2]:
                t1 = time.perf_counter_ns()
                cpu1 = cpu_ns(pid)
                tc1 = time.perf_counter_ns()
                _, _, t0, tc0, cpu0 = pending
                self.calls.append(Call(NAMES[index], rep, t1 - t0, claimed, cpu1 - cpu0, tc1 - tc0))
                pending = None
            else:
                self.errors.append(f"out-of-order message kind={kind} callable={index} rep={rep}")
                return


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        try:
            chunk = os.read(fd, n - len(buf))
        except OSError:
            return None
        if not chunk:
            return None
        buf += chunk
    return buf


def find_worker(root_pid: int) -> int:
    """The worker's pid as this (the parent's) PID namespace sees it: the deepest descendant
    of the sandbox's first process whose command line runs the worker module."""
    children: dict[int, list[int]] = {}
    cmdlines: dict[int, bytes] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdlines[int(entry.name)] = (entry / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    best, stack = 0, [root_pid]
    while stack:
        pid = stack.pop()
        if WORKER_MARK in cmdlines.get(pid, b""):
            best = pid
        stack.extend(children.get(pid, []))
    return best or root_pid


def _schedstat_ns(pid: int) -> int | None:
    total, seen = 0, False
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
                seen = True
            except (OSError, ValueError, IndexError):
                continue
    except OSError:
        return None
    return total if seen else None


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of ``pid`` in nanoseconds (0 when it is gone)."""
    ns = _schedstat_ns(pid)
    if ns is not None:
        return ns
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0


def worker_clock(env: dict[str, str] | os._Environ[str]) -> Callable[..., tuple[float, Any]] | None:
    """Worker side: the clock that hands every timed call to the parent (None: no pipes).

    On the GPU (UNTESTED ON A GPU) the call inside the window is ``timing._time_cuda``: full
    sync, events, full sync; the claim is the events' time, and the parent's clock around it,
    which includes every kernel of the call, bounds it from above."""
    raw = env.pop(ENV, None)
    if not raw:
        return None
    up, down = (int(x) for x in raw.split(","))
    os.set_inheritable(up, False)
    os.set_inheritable(down, False)
    write, read, pack, now = os.write, os.read, MSG.pack, time.perf_counter_ns
    index = {n: i for i, n in enumerate(NAMES)}

    os.set_blocking(down, False)

    def clock(name: str, rep: int, fn: Callable[[], Any],
              claim: Callable[[Any], int] | None = None) -> tuple[float, Any]:
        i = index[name]
        write(up, pack(TICK, i, rep, 0))
        # Spin for GO rather than block: a blocked worker gives its core away, and on a busy host
        # another process then cools its caches (the honest control timed 2-3x slower).
        while True:
            try:
                if read(down, 1):
                    break
            except BlockingIOError:
                continue
            raise EOFError("the parent's clock went away")
        t0 = now()
        out = fn()
        t1 = now()
        claimed = t1 - t0 if claim is None else claim(out)  # GPU: the CUDA events' time
        write(up, pack(DONE, i, rep, max(0, claimed)))
        return (t1 - t0) / 1e6, out

    for k in range(NULL_CALLS):  # the hop noise, measured before anything else is timed
        clock("null", k, lambda: None)
    return clock


def consistency(calls: list[Call], threads: int, reps: int, names: list[str]) -> str:
    """"" when the worker's claims agree with the parent's clock and CPU reading; else why not.
    ``threads`` <= 0 skips the CPU-time rule (GPU runs)."""
    null = [c.wall_ns - c.claimed_ns for c in calls if c.name == "null"]
    if len(null) < NULL_CALLS // 2:
        return "the worker skipped the clock calibration"
    # Scheduling delays on a busy host only ever lengthen the parent's view of a call: compare
    # the least-delayed calls (a low quantile), not the median. A forged clock shortens every
    # claim it touches, so the gap survives in the low quantile.
    null.sort()
    hop, spread = null[0], statistics.median(null) - null[0]
    for name in names:
        mine = [c for c in calls if c.name == name]
        if len(mine) != reps:
            return f"{name}: {len(mine)} of {reps} timed calls reached the parent's clock"
        claimed = statistics.median(c.claimed_ns for c in mine)
        gaps = sorted(c.wall_ns - c.claimed_ns for c in mine)
        excess = gaps[len(gaps) // 10] - hop
        allowed = GAP_SHARE * claimed + spread + GAP_FLOOR_NS
        if excess > allowed:
            return (f"{name}: claims {claimed / 1e6:.4g} ms a call; the parent's clock saw at least "
                    f"{(claimed + excess) / 1e6:.4g} ms in most calls (pipe hop {hop / 1e6:.3g} ms removed)")
        if threads <= 0:
            continue  # GPU: the host spins in synchronize; CPU time says nothing of the kernels
        cpu = sum(c.cpu_ns for c in mine)
        window = sum(c.cpu_wall_ns for c in mine)
        if cpu > CPU_SLACK * threads * window + 2_000_000 * len(mine) ** 0.5:
            return (f"{name}: used {cpu / max(window, 1):.2f} cores during its calls; "
                    f"it was given {threads} thread(s)")
    return ""


def parent_timings(calls: list[Call], names: list[str]) -> dict[str, list[float]]:
    """Milliseconds per call of each callable, as the parent received them (checked claims)."""
    return {n: [c.claimed_ns / 1e6 for c in calls if c.name == n] for n in names}
