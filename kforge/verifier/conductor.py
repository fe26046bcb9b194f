"""The parent's side of a timing: the schedule of every clocked call, over several workers.

    each worker says HELLO (its input sets)   (the reference's: eager, compiled; the candidate's)
    the machine to this timing alone          (device_lease.timing_window)
      calibration      every worker: NULL_CALLS empty windows (the hop)
      warm-up          every callable, unclocked (its outputs' storage: reused or not)
      sizing (CPU)     PROBES single calls each -> its batch k (handshake.batch_size)
      reps             in turn, rotated each rep: one CALL per callable (k calls, each on its own
                       input set, each with a fresh content), clocked; a few of the candidate's,
                       chosen at random here, KEEP an output for the judge
      fresh check      a fresh ModelNew and the timed one on a new content, both to the judge
    the shares back

Every call's inputs are new (``content.py``): drawn here, from a generator the workers never
see, as is the choice of which calls the judge sees. While one worker is timed the others block
on their pipes; the candidate's process is read for CPU time at the start and the end of the
schedule, while it waits, and may have used its threads only while it was asked to work
(``handshake.cpu_verdict``).
"""

from __future__ import annotations

import random
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from kforge.verifier.content import Content, draw
from kforge.verifier.device_lease import timing_window
from kforge.verifier.handshake import (
    ACK,
    BATCH_NS,
    DONE,
    HELLO,
    NAMES,
    NULL_CALLS,
    PROBE,
    PROBES,
    TICK,
    Call,
    LinkError,
    WorkerLink,
    batch_size,
    hop_of,
)

RUNS = 2  # consecutive calls on one buffer set (a repeated pointer, new contents)
CHECKS = 6  # timed candidate calls the judge sees
# CPU: before a window of another worker than the last one, the last one's OpenMP threads get this
# long to stop spinning (libgomp spins a while after a parallel region before it sleeps): on the
# 2-core dev host they stole the next worker's cores and a 3 ms GEMM timed 3.3-7.1 ms (CV 35-45%)
SETTLE_S = 0.002


@dataclass
class Kept:
    """A call whose output went to the judge: the content its inputs had."""

    tag: int
    name: str
    rep: int
    slot: int
    content: Content
    fresh: str = ""  # "fresh" / "timed": the fresh-instance check's two calls


@dataclass
class Result:
    calls: list[Call] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)
    waited_s: float = 0.0  # for the machine to itself
    cpu_ns: int = 0  # the candidate's process over the schedule
    busy_ns: int = 0  # the parent's clock while the candidate's process had a command to answer
    capacity: int = 1
    missing: list[str] = field(default_factory=list)  # callables a worker did not offer
    error: str = ""  # the wire broke (which worker: ``error_link``)
    error_link: str = ""


@dataclass
class Conductor:
    links: dict[str, WorkerLink]  # callable name -> its worker's link (several callables may share one)
    device: str
    warmup: int
    reps: int
    others: list[WorkerLink] = field(default_factory=list)  # workers with nothing timed (the oracle)
    batch_ns: int = BATCH_NS
    timeout_s: float = 300.0
    checks: int = CHECKS
    rng: random.Random = field(default_factory=lambda: random.Random(secrets.randbits(64)))
    deadline: float = 0.0
    result: Result = field(default_factory=Result)
    _next_tag: int = 0
    _cursor: dict[str, int] = field(default_factory=dict)
    _current: str = ""  # the callable (or worker) the schedule is at: who to blame if the wire breaks
    _busy_from: int | None = None  # since when the candidate's process has had a command to answer
    _last_link: WorkerLink | None = None  # the worker of the last window

    def run(self) -> Result:
        """The whole schedule; a broken wire ends it (``result.error``), never raises."""
        self.deadline = time.monotonic() + self.timeout_s
        workers = self._workers()
        try:
            capacities, offered = [], {}
            for label, link in workers.items():
                self._current = label
                _, _, value, names = link.expect(HELLO, self.deadline, f"{label}'s HELLO")
                capacities.append(int(value))
                offered[id(link)] = {n for i, n in enumerate(NAMES) if names >> i & 1}
            self.result.capacity = max(1, min(capacities))
            for name, link in list(self.links.items()):  # torch.compile may have failed: eager stands
                if name not in offered[id(link)]:
                    self.result.missing.append(name)
                    del self.links[name]
            for link in workers.values():
                link.waiting(True)
            with timing_window(self.device == "cuda") as waited:
                for link in workers.values():
                    link.waiting(False)
                self.result.waited_s = waited
                self.deadline += waited  # waiting for the machine is not the workers' time
                cand = self.links.get("candidate")
                cpu0 = cand.cpu() if cand is not None else 0  # it waits for a command now
                self._schedule(workers)
                self.result.cpu_ns = cand.cpu() - cpu0 if cand is not None else 0
        except LinkError as err:
            self.result.error = str(err)
            self.result.error_link = self._current
        return self.result

    def _workers(self) -> dict[str, WorkerLink]:
        """Every worker once, under the name of its first callable."""
        out: dict[str, WorkerLink] = {}
        named = [*self.links.items(), *((f"worker {i}", link) for i, link in enumerate(self.others))]
        for name, link in named:
            if all(link is not other for other in out.values()):
                out[name] = link
        return out

    def _schedule(self, workers: dict[str, WorkerLink]) -> None:
        names = list(self.links)
        for label, link in workers.items():  # calibration: every worker's hop
            self._current = label
            self._send(link, {"op": "null", "n": NULL_CALLS})
            for k in range(NULL_CALLS):
                self._window(link, "null", k, 1)
            self._answer(link, ACK)
        reuse: set[str] = set()
        for name in names:
            self._current = name
            self._send(self.links[name], {"op": "warm", "name": name,
                                          "contents": [self._content().to_json() for _ in range(max(1, self.warmup))]})
            _, _, flags, _ = self._answer(self.links[name], ACK)
            if flags & 1:
                reuse.add(name)  # one output buffer handed back again: no batches
        sizes = {name: 1 for name in names}
        if self.device != "cuda" and self.result.capacity >= 2 and self.batch_ns > 0:
            for name in names:
                avail = 1 if name in reuse else self.result.capacity
                fastest = None
                for _ in range(PROBES):
                    call = self._call(name, PROBE, [0], probe=True)
                    took = call.wall_ns - hop_of(self.result.calls)
                    fastest = took if fastest is None else min(fastest, took)
                sizes[name] = batch_size(fastest or 0, avail, self.batch_ns)
        self.result.sizes = sizes
        checked = set(self.rng.sample(range(self.reps), min(self.checks, self.reps)))
        for rep in range(self.reps):
            rotated = names[rep % len(names):] + names[: rep % len(names)]
            for name in rotated:
                self._call(name, rep, self._slots(name, rep, sizes[name]),
                           check=name == "candidate" and rep in checked)
        if "candidate" in self.links:
            self._fresh_check()

    def _content(self) -> Content:
        return draw(self.rng)

    def _slots(self, name: str, rep: int, k: int) -> list[int]:
        """Buffer sets of one CALL: unbatched, ``RUNS`` calls in a row on one of two sets; a
        batch, k distinct sets starting where the callable's last batch ended (a repeated
        pointer with new contents)."""
        if k == 1:
            return [(rep // RUNS) % 2]
        start = self._cursor.get(name, 0)
        slots = [(start + j) % self.result.capacity for j in range(k)]
        self._cursor[name] = slots[-1]
        return slots

    def _send(self, link: WorkerLink, message: dict[str, Any]) -> None:
        """A command; the candidate's process is busy (may use its threads) until it answers."""
        if link is self.links.get("candidate") and self._busy_from is None:
            self._busy_from = time.perf_counter_ns()
        link.send(message)

    def _answer(self, link: WorkerLink, kind: int, what: str = "") -> tuple[int, int, int, int]:
        """The message that ends a command's exchange."""
        got = link.expect(kind, self.deadline, what or "ACK")
        if link is self.links.get("candidate") and self._busy_from is not None:
            self.result.busy_ns += time.perf_counter_ns() - self._busy_from
            self._busy_from = None
        return got

    def _window(self, link: WorkerLink, name: str, rep: int, k: int) -> Call:
        index, got_rep, value, _ = link.expect(TICK, self.deadline, f"{name}'s TICK")
        if NAMES[index] != name or got_rep != (rep & 0xFFFFFFFF) or value != k:
            raise LinkError(f"{name}: a TICK for {NAMES[index] if index < len(NAMES) else index} rep {got_rep} "
                            f"k {value}, where rep {rep} k {k} was due")
        if self._last_link is not link and self.device != "cuda":
            time.sleep(SETTLE_S)  # the last worker's threads finish spinning before this one's window
        self._last_link = link
        t0 = time.perf_counter_ns()
        link.go(k)
        _, _, claimed, host = link.expect(DONE, self.deadline, f"{name}'s DONE")
        t1 = time.perf_counter_ns()
        call = Call(name, rep, t1 - t0, claimed, k=k, host_ns=host)
        self.result.calls.append(call)
        return call

    def _call(self, name: str, rep: int, slots: list[int], *, probe: bool = False, check: bool = False) -> Call:
        self._current = name
        link = self.links[name]
        contents = [self._content() for _ in slots]
        self._send(link, {"op": "call", "name": name, "rep": rep if not probe else -1, "slots": slots,
                          "contents": [c.to_json() for c in contents], "checked": name == "candidate"})
        call = self._window(link, name, PROBE if probe else rep, len(slots))
        call.probe = probe
        if name == "candidate":  # after DONE: which output the judge sees (if any) is chosen now
            j = self.rng.randrange(len(slots)) if check else -1
            tag = self._tag() if check else -1
            link.send({"op": "keep", "index": j, "tag": tag})
            if check:
                self.result.kept.append(Kept(tag, name, rep, slots[j], contents[j]))
            self._answer(link, ACK)
        return call

    def _tag(self) -> int:
        self._next_tag += 1
        return self._next_tag

    def _fresh_check(self) -> None:
        """A fresh ModelNew and the one timed many times, on one new content: both to the judge."""
        self._current = "candidate"
        link = self.links["candidate"]
        content = self._content()
        tags = {"fresh": self._tag(), "timed": self._tag()}
        self._send(link, {"op": "fresh", "content": content.to_json(), "tags": tags})
        self._answer(link, ACK)
        for which, tag in tags.items():
            self.result.kept.append(Kept(tag, "candidate", -1, 0, content, fresh=which))

    def bye(self, extra: dict[str, Any] | None = None) -> None:
        """Tell every worker the timing is over (each then sends what it still has and ends)."""
        for link in self._workers().values():
            try:
                link.send({"op": "bye", **(extra or {})})
            except LinkError:
                pass
