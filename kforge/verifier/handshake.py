"""The wire of a timing: the trusted parent drives every timed call and clocks it.

    parent (trusted: conductor.py)                    worker (sandboxed: the candidate's process,
                                                       or the reference's, which times the baselines)
    ── CALL {name, rep, slots, contents} ── down ───>  each input set refilled with its content
                                                       (content.py); GPU: L2 flush, full sync
    <──────────────────────────────────── up ─── TICK(callable, rep, k)
    read the worker's CPU time, start the clock
    ── GO(k) ── a word in shared memory ──────────>  k calls (its own clock around them)
    <──────────────────────────────────── up ─── DONE(callable, rep, claimed ns, host ns)
    stop the clock, read the worker's CPU time
    (a checked call) ── KEEP {index | -1, tag} ──>  that output to the judge, the rest dropped
    <──────────────────────────────────── up ─── ACK

Down is a pipe of length-prefixed JSON messages (``protocol.write_message``); up a pipe of
fixed structs; GO a word in a memfd the parent maps and the worker maps read-only: the worker
spins on it, because a wait made of system calls slows the call that follows it (on the 2-core
dev host 200 failed non-blocking reads before a ~0.15 ms call made it 1.7x slower). A worker
that is not being timed blocks on its down pipe and uses no CPU (the parent checks).

The parent's per-call figure on the CPU is (its clock - the fastest empty hop) / k; on the GPU
the worker's CUDA events, which the parent's clock (around a window that ends with a full device
sync) bounds from above. :func:`consistency` rejects, as ``timing_inconsistent``, claims that
fall short of the parent's clock beyond the measured hop noise, CPU time beyond the worker's
thread count over the schedule. The CPU time is read only while the worker is blocked (a
running thread's count in /proc is as old as its last tick, up to 4 ms: a window's refill
landed in it), over the whole schedule: the candidate's process may use its threads while it
has been asked to do something (a command sent, its answer not yet back), and nothing while it
waits, when the others are timed (:func:`cpu_verdict`).

Batches (CPU): the parent's clock has the jitter of waking its thread (tens of microseconds on
a VM), too much for calls of a few microseconds. After three sizing calls (``PROBE``, k = 1)
the parent sets k = ceil(``BATCH_NS`` / the fastest), at most the worker's input sets and
``MAX_BATCH``, and every later CALL of that callable runs k calls, each on its own input set.
Input sets for batches exist only while all of them fit ``checked.BATCH_BUDGET`` (k distinct
sets are colder than the one set a lone call was just refilled in: 2 MB inputs in batches of 8
timed 3-5x slower a call), so larger inputs, calls of ``BATCH_NS`` or more and the GPU keep k = 1.
"""

from __future__ import annotations

import mmap
import os
import select
import statistics
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kforge.verifier.protocol import read_message, write_message

MSG = struct.Struct("<BBxxIQQ")  # kind, callable index, rep, value, value2
WORD = struct.Struct("<QI")  # parent -> worker, in shared memory: sequence number, value (GO: k)
HUNG_UP = 12  # offset of the parent's "gone" flag in the shared page
TICK, DONE, HELLO, ACK = 1, 2, 4, 5
PROBE = 0xFFFFFFFF  # the rep of a callable's sizing calls
PROBES = 3  # sizing calls per callable: the batch follows the fastest (a first call can stall)
BATCH_NS = 2_000_000  # a batch lasts at least this long (its handshake's cost spread over k calls)
MAX_BATCH = 32
NAMES = ("candidate", "eager", "compiled", "null")
ENV = "KFORGE_LINK_FDS"
WORKER_MARK = b"kforge.verifier.worker_main"
NULL_CALLS = 15
GAP_SHARE = 0.25  # claims may fall short of the parent's clock by this share of the call ...
GAP_FLOOR_NS = 100_000  # ... plus the hop's spread plus this
CPU_SLACK = 1.25  # CPU time may exceed threads x busy wall by this factor (scheduler accounting) ...
CPU_FLOOR_NS = 30_000_000  # ... plus this (a tick at each end; OpenMP threads spin a little after a region)


@dataclass
class Call:
    name: str
    rep: int
    wall_ns: int  # the parent's clock: GO sent .. DONE read
    claimed_ns: int
    k: int = 1  # calls in this batch
    probe: bool = False  # a sizing call (not a timing sample)
    host_ns: int = 0  # GPU: the worker's host clock around its synchronised window


def batch_size(per_call_ns: float, avail: int, batch_ns: int = BATCH_NS) -> int:
    """Calls per handshake: enough for ``batch_ns``, at most ``avail`` (the worker's input
    sets) and ``MAX_BATCH``; 1 when batching is off (``batch_ns`` <= 0)."""
    if batch_ns <= 0:
        return 1
    want = -(-batch_ns // max(int(per_call_ns), 1))
    return int(max(1, min(want, avail, MAX_BATCH)))


class LinkError(EOFError):
    """The worker went away, broke the protocol or did not answer in time."""


class WorkerLink:
    """The parent's end of one worker's wire (a ``sandbox.Companion``)."""

    def __init__(self) -> None:
        self._down_r, self._down_w = os.pipe()
        self._up_r, self._up_w = os.pipe()
        self._shm_fd = os.memfd_create("kforge-clock", os.MFD_CLOEXEC)
        os.ftruncate(self._shm_fd, mmap.PAGESIZE)
        self._shm: mmap.mmap | None = mmap.mmap(self._shm_fd, mmap.PAGESIZE)
        self._seq = 0
        self.root_pid = 0
        self._clock: TaskClock | None = None
        self._waited = 0.0
        self._wait_since: float | None = None

    @property
    def waited_s(self) -> float:
        """Seconds the worker has waited while the parent waited for the machine to itself (still
        counting while it waits): the sandbox's timeout does not count them."""
        live = time.monotonic() - self._wait_since if self._wait_since is not None else 0.0
        return self._waited + live

    def waiting(self, on: bool) -> None:
        if on and self._wait_since is None:
            self._wait_since = time.monotonic()
        elif not on and self._wait_since is not None:
            self._waited += time.monotonic() - self._wait_since
            self._wait_since = None

    @property
    def pass_fds(self) -> tuple[int, int, int]:
        return self._down_r, self._up_w, self._shm_fd

    def env(self) -> dict[str, str]:
        return {ENV: f"{self._down_r},{self._up_w},{self._shm_fd}"}

    def started(self, root_pid: int) -> None:
        for fd in (self._down_r, self._up_w, self._shm_fd):
            os.close(fd)
        self.root_pid = root_pid

    def send(self, message: dict[str, Any]) -> None:
        try:
            write_message(self._down_w, message)
        except OSError as err:
            raise LinkError(f"the worker stopped reading ({err.strerror})") from err

    def receive(self, deadline: float) -> tuple[int, int, int, int, int]:
        """The next struct from the worker; raises LinkError at EOF or past ``deadline``."""
        buf = b""
        while len(buf) < MSG.size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LinkError("the worker did not answer in time")
            ready, _, _ = select.select([self._up_r], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(self._up_r, MSG.size - len(buf))
            if not chunk:
                raise LinkError("the worker's wire closed")
            buf += chunk
        kind, index, rep, value, value2 = MSG.unpack(buf)
        return kind, index, rep, value, value2

    def expect(self, kind: int, deadline: float, what: str) -> tuple[int, int, int, int]:
        got, index, rep, value, value2 = self.receive(deadline)
        if got != kind:
            raise LinkError(f"out-of-order message: {got} where {what} was due")
        return index, rep, value, value2

    def go(self, value: int) -> None:
        """One parent -> worker word: the value first, then the sequence number it is read by."""
        if self._shm is None:
            raise LinkError("hung up")
        self._seq += 1
        struct.pack_into("<I", self._shm, 8, value)
        struct.pack_into("<Q", self._shm, 0, self._seq)

    def cpu(self) -> int:
        """The worker's CPU time so far, all threads (nanoseconds)."""
        if self._clock is None:
            self._clock = TaskClock(find_worker(self.root_pid))
        return self._clock.read()

    @property
    def cpu_source(self) -> str:
        return self._clock.source if self._clock is not None else ""

    def hang_up(self) -> None:
        """Raise the "gone" flag and close the down pipe: a worker waiting stops (EOFError)."""
        shm, self._shm = self._shm, None
        if shm is not None:
            struct.pack_into("<I", shm, HUNG_UP, 1)
            shm.close()
        for fd in (self._down_w,):
            try:
                os.close(fd)
            except OSError:
                pass
        self._down_w = -1

    def close(self) -> None:
        self.hang_up()
        try:
            os.close(self._up_r)
        except OSError:
            pass
        if self._clock is not None:
            self._clock.close()


class Channel:
    """The worker's end (made before any candidate code runs; its functions reach each other
    through closure cells, so rebinding a module name changes nothing they call)."""

    def __init__(self, env: dict[str, str] | os._Environ[str]) -> None:
        raw = env.pop(ENV)
        down, up, shm_fd = (int(x) for x in raw.split(","))
        for fd in (down, up):
            os.set_inheritable(fd, False)
        page = mmap.mmap(shm_fd, mmap.PAGESIZE, prot=mmap.PROT_READ)
        os.close(shm_fd)
        write, pack, now, unpack = os.write, MSG.pack, time.perf_counter_ns, WORD.unpack_from
        flag = struct.Struct("<I").unpack_from
        index = {n: i for i, n in enumerate(NAMES)}
        heard = [0]

        def say(kind: int, i: int = 0, rep: int = 0, value: int = 0, value2: int = 0) -> None:
            write(up, pack(kind, i, rep & 0xFFFFFFFF, max(0, value), max(0, value2)))

        def answer() -> int:
            want = heard[0] + 1
            while True:  # spin: no system call between GO and the call (module docstring)
                seq, value = unpack(page, 0)
                if seq == want:
                    heard[0] = want
                    return value
                if flag(page, HUNG_UP)[0]:
                    raise EOFError("the parent's clock went away")

        def clock(name: str, rep: int, fn: Callable[[], Any], k: int = 1,
                  claim: Callable[[Any], tuple[int, int]] | None = None) -> Any:
            """One clocked window: TICK, GO, ``fn`` (k calls), DONE with the claim (the worker's
            own clock, or ``claim(out)``: the GPU's events and host time)."""
            i = index[name]
            say(TICK, i, rep, k)
            if answer() != k:
                raise EOFError(f"the parent's clock set another batch than {k} for {name}")
            t0 = now()
            out = fn()
            t1 = now()
            claimed, host = (t1 - t0, 0) if claim is None else claim(out)
            say(DONE, i, rep, claimed, host)
            return out

        def receive() -> dict[str, Any] | None:
            return read_message(down)

        self.say, self.clock, self.receive = say, clock, receive


def calibrate(channel: Channel, n: int) -> None:
    """The worker's side of the hop measurement: ``n`` empty clocked windows."""
    for k in range(n):
        channel.clock("null", k, lambda: None)


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


def hop_of(calls: list[Call]) -> int:
    null = [c.wall_ns - c.claimed_ns for c in calls if c.name == "null"]
    return min(null) if null else 0


def consistency(calls: list[Call], reps: int, names: list[str]) -> str:
    """"" when the workers' claims agree with the parent's clock; else why not. Sizing calls
    are checked like the others but are no timing samples. The calibration calls are the hop
    of the worker that made them (every worker's are named ``null``: the fastest counts)."""
    null = [c.wall_ns - c.claimed_ns for c in calls if c.name == "null"]
    if len(null) < NULL_CALLS // 2:
        return "the worker skipped the clock calibration"
    # Scheduling delays on a busy host only ever lengthen the parent's view of a call: compare
    # the least-delayed calls (a low quantile), not the median. A forged clock shortens every
    # claim it touches, so the gap survives in the low quantile.
    null.sort()
    hop, spread = null[0], statistics.median(null) - null[0]
    for name in names:
        timed = [c for c in calls if c.name == name and not c.probe]
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
    return ""


def cpu_verdict(cpu_ns: int, busy_ns: int, threads: int) -> str:
    """"" unless the candidate's process used more CPU over the schedule than its threads
    allow while it was busy (more cores than given, or work while the others were timed)."""
    allowed = CPU_SLACK * threads * busy_ns + CPU_FLOOR_NS
    if cpu_ns > allowed:
        return (f"candidate: its process used {cpu_ns / 1e6:.1f} ms of CPU over the timing, "
                f"{cpu_ns / max(busy_ns, 1):.2f} cores while it was asked to work ({busy_ns / 1e6:.1f} ms) with "
                f"{threads} thread(s) given: more threads than given, or work left running while the "
                "baselines were timed")
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
    """Milliseconds per call of each callable, one figure per timed batch, in rep order.
    ``parent_clock`` (CPU): the parent's own clock less the fastest empty hop, over the batch's
    k calls; else (GPU) the checked claims (the CUDA events, which the parent's clock bounds)."""
    hop = hop_of(calls)
    if parent_clock:
        return {n: [max(0, c.wall_ns - hop) / c.k / 1e6 for c in calls if c.name == n and not c.probe]
                for n in names}
    return {n: [c.claimed_ns / c.k / 1e6 for c in calls if c.name == n and not c.probe] for n in names}
