"""Timing a candidate cannot forge on the CPU: the trusted parent clocks every timed batch.

    worker (sandboxed, runs candidate code)          parent (trusted)
    ── TICK(fn, rep, k) ──── pipe ─────────────────> read the worker's CPU time, start clock
    <────────────────────────────── shared word ── GO(k)
       k calls of fn (its own clock around them)
    ── DONE(fn, rep, claimed ns) ──── pipe ────────> stop clock, read the worker's CPU time

Before anything is clocked, a profile's worker sends GATE and sleeps until the parent answers:
the parent holds the device's lease shared and trades it for the whole device then
(``device_lease.py``), so no other job's GPU work runs while this one imports its candidate and
times it; the time it waited (``CallTimer.waited_s``) is not the worker's (the sandbox's
timeout skips it).

The worker waits for GO by spinning on a shared-memory word (a memfd the parent maps and the
worker maps read-only), not on a pipe: a wait made of system calls slows the call that follows
it (measured on the 2-core dev host: 200 failed non-blocking reads before a ~0.15 ms call made
it 1.7x slower), and the parent's CPU-time reads (every thread's schedstat) made the worker
wait, and spin in system calls, for a good part of a millisecond before every call.

Batches (CPU): the parent's clock has the jitter of waking its thread (tens of microseconds on
a VM), too much for calls of a few microseconds. So the parent sizes a batch per callable from
a first clocked call (``PROBE``: k = 1): k = ceil(``BATCH_NS`` / that call's time), at most the
worker's batch input sets and ``MAX_BATCH``, and sends k back (``SIZE``); every later
handshake of that callable runs k calls, each on its own input set. The parent's per-call
figure is (its clock - the fastest empty hop) / k. Input sets for batches exist only while
all of them fit ``checked.BATCH_BUDGET`` (k distinct sets are colder than the one set a lone
call was just refilled in: with 2 MB inputs a batch of 8 measured 3-5x slower a call on the dev
host), so larger inputs, calls of ``BATCH_NS`` or more, and the GPU (per-call L2 flush and
events) keep k = 1.

The parent's wall time of a batch is the claim plus two pipe hops, which the worker measures
first with empty calls (``NULL``). The parent reads the worker's CPU time from
``/proc/<pid>/task/*/schedstat`` (nanoseconds, every thread; ``/proc/<pid>/stat`` ticks where
schedstat is missing). :func:`consistency` rejects, as ``timing_inconsistent``, a candidate
whose claims fall short of the parent's clock beyond the measured hop noise, or that burned
more CPU in its calls than its thread count allows; the parent's records, not the worker's
report, become the timing. Whatever the candidate does inside its process (a replaced clock,
a patched timing module) cannot move the parent's clock. What the parent cannot see is how
many of the k calls the worker really made: a candidate that rewrites the harness loop could
run fewer (the in-process power named in docs/VERIFY_DESIGN.md's known limits).
"""

from __future__ import annotations

import mmap
import os
import statistics
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MSG = struct.Struct("<BBxxIQ")  # kind, callable index, rep, value (TICK: batch k; DONE: claimed ns)
WORD = struct.Struct("<QI")  # parent -> worker, in shared memory: sequence number, value (GO: k; SIZE: k)
HUNG_UP = 12  # offset of the parent's "gone" flag in the shared page
TICK, DONE, GATE = 1, 2, 3  # GATE: the worker waits for the device to itself (device_lease.py)
PROBE = 0xFFFFFFFF  # the rep of a callable's sizing calls (the first PROBES, one call each)
PROBES = 3  # sizing calls per callable: the batch follows the fastest (a first call can stall)
BATCH_NS = 2_000_000  # a batch lasts at least this long (its handshake's cost spread over k calls)
MAX_BATCH = 32
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
    k: int = 1  # calls in this batch
    probe: bool = False  # the callable's sizing call (not a timing sample)


def batch_size(per_call_ns: float, avail: int, batch_ns: int = BATCH_NS) -> int:
    """Calls per handshake: enough for ``batch_ns``, at most ``avail`` (the worker's input
    sets) and ``MAX_BATCH``; 1 when batching is off (``batch_ns`` <= 0)."""
    if batch_ns <= 0:
        return 1
    want = -(-batch_ns // max(int(per_call_ns), 1))
    return int(max(1, min(want, avail, MAX_BATCH)))


@dataclass
class CallTimer:
    """Parent side: the pipes, the serving thread and the calls it recorded."""

    threads: int | None = None  # the worker's pinned thread count (``timing.pin_cpu``)
    batch_ns: int = BATCH_NS  # 0: one call per handshake (benchmarks/verify_cpu_clock.py)
    calls: list[Call] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)  # the batch the parent set per callable
    cpu_source: str = ""
    # called (in the serving thread) when the worker asks for the device to itself, before any
    # candidate code runs; it blocks until granted (``runner.run_job`` sets it to the lease's
    # ``exclusive``); None: granted at once
    on_gate: Callable[[], object] | None = None
    _gate: tuple[float, float] | None = None  # (asked, granted) on the monotonic clock

    @property
    def waited_s(self) -> float:
        """Seconds the worker has waited at the gate (still counting while it waits): the
        sandbox's timeout does not count them."""
        if self._gate is None:
            return 0.0
        asked, granted = self._gate
        return (granted or time.monotonic()) - asked

    def __post_init__(self) -> None:
        self._up_r, self._up_w = os.pipe()  # worker -> parent
        self._shm_fd = os.memfd_create("kforge-clock", os.MFD_CLOEXEC)  # parent -> worker
        os.ftruncate(self._shm_fd, mmap.PAGESIZE)
        self._shm: mmap.mmap | None = mmap.mmap(self._shm_fd, mmap.PAGESIZE)
        self._seq = 0
        self._reader: TaskClock | None = None
        self._thread: threading.Thread | None = None

    @property
    def pass_fds(self) -> tuple[int, int]:
        return self._up_w, self._shm_fd

    def env(self) -> dict[str, str]:
        return {ENV: f"{self._up_w},{self._shm_fd}"}

    def started(self, root_pid: int) -> None:
        os.close(self._up_w)
        os.close(self._shm_fd)
        self._thread = threading.Thread(target=self._serve, args=(root_pid,), daemon=True)
        self._thread.start()

    def _say(self, value: int) -> None:
        """One parent -> worker word: the value first, then the sequence number it is read by."""
        if self._shm is None:
            raise OSError("hung up")
        self._seq += 1
        struct.pack_into("<I", self._shm, 8, value)
        struct.pack_into("<Q", self._shm, 0, self._seq)

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._hang_up()
        try:
            os.close(self._up_r)
        except OSError:
            pass

    def _hang_up(self) -> None:
        """Raise the "gone" flag: a worker waiting for GO stops (``timing_inconsistent``
        follows from ``errors``) instead of waiting forever."""
        shm, self._shm = self._shm, None
        if shm is not None:
            struct.pack_into("<I", shm, HUNG_UP, 1)
            shm.close()

    def _serve(self, root_pid: int) -> None:
        try:
            self._serve_calls(root_pid)
        finally:
            self._hang_up()
            if self._reader is not None:
                self._reader.close()

    def _serve_calls(self, root_pid: int) -> None:
        # Off the worker's cores (it pins to the first ``threads`` of the same set): sharing
        # its core, this thread ran between the worker's calls and cooled its caches (the honest
        # control timed 2-3x slower). Linux applies this to the calling thread only.
        cores = sorted(os.sched_getaffinity(0))
        spare = cores[max(1, min(self.threads or len(cores), len(cores))):]
        if spare:
            os.sched_setaffinity(0, spare)
        pending: tuple[int, int, int, int, int, int, bool, int] | None = None
        while True:
            data = _read_exact(self._up_r, MSG.size)
            if data is None:
                return
            kind, index, rep, value = MSG.unpack(data)
            if kind == GATE and self._gate is None and not self.calls and pending is None:
                self._gate = (time.monotonic(), 0.0)
                if self.on_gate is not None:
                    self.on_gate()
                self._gate = (self._gate[0], time.monotonic())
                try:
                    self._say(1)
                except (OSError, ValueError):
                    return
            elif kind == TICK and pending is None and index < len(NAMES):
                name = NAMES[index]
                probe = rep == PROBE
                probes = sum(1 for c in self.calls if c.name == name and c.probe)
                if probe and (name == "null" or probes >= PROBES or (name in self.sizes and not probes)):
                    self.errors.append(f"{name}: a sizing call too many")
                    return
                k = 1 if probe else self.sizes.get(name, 1)
                if not probe and value != k:
                    self.errors.append(f"{name}: asked for a batch of {value}; the parent set {k}")
                    return
                if self._reader is None:
                    self._reader = TaskClock(find_worker(root_pid))
                    self.cpu_source = self._reader.source
                reader = self._reader
                tc0 = time.perf_counter_ns()
                cpu0 = reader.read()
                t0 = time.perf_counter_ns()
                try:
                    self._say(k)
                except (OSError, ValueError):
                    return
                pending = (index, rep, t0, tc0, cpu0, k, probe, value)
            elif kind == DONE and pending is not None and (index, rep) == pending[:2]:
                t1 = time.perf_counter_ns()
                cpu1 = self._reader.read() if self._reader is not None else 0
                tc1 = time.perf_counter_ns()
                _, _, t0, tc0, cpu0, k, probe, avail = pending
                call = Call(NAMES[index], rep, t1 - t0, value, cpu1 - cpu0, tc1 - tc0, k=k, probe=probe)
                self.calls.append(call)
                pending = None
                if probe:  # the batch for this callable, from the parent's own clock (fastest probe)
                    fastest = min(c.wall_ns for c in self.calls if c.name == call.name and c.probe)
                    size = batch_size(fastest - self.hop_ns(), avail, self.batch_ns)
                    self.sizes[call.name] = size
                    try:
                        self._say(size)
                    except (OSError, ValueError):
                        return
            else:
                self.errors.append(f"out-of-order message kind={kind} callable={index} rep={rep}")
                return

    def hop_ns(self) -> int:
        """The fastest empty handshake (the pipe hops alone), from the calibration calls."""
        return hop_of(self.calls)


def hop_of(calls: list[Call]) -> int:
    null = [c.wall_ns - c.claimed_ns for c in calls if c.name == "null"]
    return min(null) if null else 0


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


class TaskClock:
    """The worker's CPU time, all threads, read cheaply and often: the thread list is listed
    at every read (a thread started mid-call counts), each thread's schedstat is kept open and
    read with one ``pread``; ``/proc/<pid>/stat`` ticks where schedstat is missing."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fds: dict[str, int] = {}
        self.done = 0  # CPU time of threads that have ended
        self.last: dict[str, int] = {}
        self.source = "schedstat" if _schedstat_ns(pid) is not None else "stat"

    def read(self) -> int:
        if self.source != "schedstat":
            return cpu_ns(self.pid)
        try:
            tids = os.listdir(f"/proc/{self.pid}/task")
        except OSError:
            tids = []
        total = 0
        seen = set(tids)
        for tid in tids:
            fd = self.fds.get(tid)
            try:
                if fd is None:
                    fd = self.fds[tid] = os.open(f"/proc/{self.pid}/task/{tid}/schedstat", os.O_RDONLY)
                ns = int(os.pread(fd, 128, 0).split()[0])
            except (OSError, ValueError, IndexError):
                continue
            self.last[tid] = ns
            total += ns
        for tid in [t for t in self.fds if t not in seen]:  # ended: keep what it used
            self.done += self.last.pop(tid, 0)
            os.close(self.fds.pop(tid))
        return total + self.done

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


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


def worker_clock(env: dict[str, str] | os._Environ[str], *, gate: bool = False) -> Callable[..., tuple[float, Any]] | None:
    """Worker side: the clock that hands every timed batch to the parent (None: no pipes).
    ``gate``: first wait until the parent holds the device to itself (``device_lease.py``);
    call it before any candidate code runs.

    ``clock(name, rep, fn, claim=None, k=1)``: fn runs the batch's k calls (the k the parent
    set at the callable's sizing call, ``clock.probe(name, fn, avail)``, which returns it).
    On the GPU (k = 1) the call inside the window is ``timing._time_cuda``: full sync, events,
    full sync; the claim is the events' time, and the parent's clock around it, which includes
    every kernel of the call, bounds it from above."""
    raw = env.pop(ENV, None)
    if not raw:
        return None
    up, shm_fd = (int(x) for x in raw.split(","))
    os.set_inheritable(up, False)
    page = mmap.mmap(shm_fd, mmap.PAGESIZE, prot=mmap.PROT_READ)
    os.close(shm_fd)
    write, pack, now, unpack = os.write, MSG.pack, time.perf_counter_ns, WORD.unpack_from
    flag = struct.Struct("<I").unpack_from
    index = {n: i for i, n in enumerate(NAMES)}
    heard = [0]

    def answer(nap: float = 0.0) -> int:
        # Spin on the shared word: no system call between GO and the call (see the docstring);
        # ``nap``: sleep between looks instead (a wait that may be long: GATE)
        want = heard[0] + 1
        while True:
            seq, value = unpack(page, 0)
            if seq == want:
                heard[0] = want
                return value
            if flag(page, HUNG_UP)[0]:
                raise EOFError("the parent's clock went away")
            if nap:
                time.sleep(nap)

    def clock(name: str, rep: int, fn: Callable[[], Any],
              claim: Callable[[Any], int] | None = None, k: int = 1) -> tuple[float, Any]:
        i = index[name]
        write(up, pack(TICK, i, rep, k))
        if answer() != k:
            raise EOFError(f"the parent's clock set another batch than {k} for {name}")
        t0 = now()
        out = fn()
        t1 = now()
        claimed = t1 - t0 if claim is None else claim(out)  # GPU: the CUDA events' time
        write(up, pack(DONE, i, rep, max(0, claimed)))
        return (t1 - t0) / 1e6, out

    def probe(name: str, fn: Callable[[], Any], avail: int) -> tuple[int, Any]:
        """The callable's ``PROBES`` sizing calls (one call each); returns (the batch k the
        parent set, the last output)."""
        i = index[name]
        k, out = 1, None
        for _ in range(PROBES):
            del out
            write(up, pack(TICK, i, PROBE, avail))
            if answer() != 1:
                raise EOFError("the parent's clock set a batch for a sizing call")
            t0 = now()
            out = fn()
            t1 = now()
            write(up, pack(DONE, i, PROBE, max(0, t1 - t0)))
            k = answer()
        return k, out

    clock.probe = probe  # type: ignore[attr-defined]
    if gate:  # may take long (other jobs finish first): sleep between looks, do not spin
        write(up, pack(GATE, 0, 0, 0))
        answer(nap=0.002)
    for k in range(NULL_CALLS):  # the hop noise, measured before anything else is timed
        clock("null", k, lambda: None)
    return clock


def consistency(calls: list[Call], threads: int, reps: int, names: list[str]) -> str:
    """"" when the worker's claims agree with the parent's clock and CPU reading; else why not.
    ``threads`` <= 0 skips the CPU-time rule (GPU runs). Sizing calls are checked like the
    others but do not count as timing samples."""
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
        timed = [c for c in mine if not c.probe]
        if len(timed) != reps:
            return f"{name}: {len(timed)} of {reps} timed calls reached the parent's clock"
        claimed = statistics.median(c.claimed_ns for c in timed)
        gaps = sorted(c.wall_ns - c.claimed_ns for c in timed)
        excess = gaps[len(gaps) // 10] - hop
        allowed = GAP_SHARE * claimed + spread + GAP_FLOOR_NS
        if excess > allowed:
            k = timed[0].k
            per = f" ({k} calls a batch)" if k > 1 else ""
            return (f"{name}: claims {claimed / 1e6:.4g} ms a batch{per}; the parent's clock saw at least "
                    f"{(claimed + excess) / 1e6:.4g} ms in most batches (pipe hop {hop / 1e6:.3g} ms removed)")
        if threads <= 0:
            continue  # GPU: the host spins in synchronize; CPU time says nothing of the kernels
        cpu = sum(c.cpu_ns for c in mine)
        window = sum(c.cpu_wall_ns for c in mine)
        if cpu > CPU_SLACK * threads * window + 2_000_000 * len(mine) ** 0.5:
            return (f"{name}: used {cpu / max(window, 1):.2f} cores during its calls; "
                    f"it was given {threads} thread(s)")
    return ""


def clock_gaps(calls: list[Call], names: list[str]) -> dict[str, float]:
    """Per callable, microseconds the parent's clock saw beyond the claim and the fastest hop
    (the low decile over timed batches: what :func:`consistency` holds to its limit)."""
    hop = hop_of(calls)
    out = {}
    for name in names:
        gaps = sorted(c.wall_ns - c.claimed_ns for c in calls if c.name == name and not c.probe)
        if gaps:
            out[name] = round((gaps[len(gaps) // 10] - hop) / 1e3, 1)
    return out


def parent_timings(calls: list[Call], names: list[str], *, parent_clock: bool = True) -> dict[str, list[float]]:
    """Milliseconds per call of each callable, one figure per timed batch. ``parent_clock``
    (CPU): the parent's own clock less the fastest empty hop, over the batch's k calls; else
    (GPU) the checked claims (the CUDA events, which the parent's clock bounds)."""
    hop = hop_of(calls)
    if parent_clock:
        return {n: [max(0, c.wall_ns - hop) / c.k / 1e6 for c in calls if c.name == n and not c.probe]
                for n in names}
    return {n: [c.claimed_ns / c.k / 1e6 for c in calls if c.name == n and not c.probe] for n in names}
