"""Baseline timings of a problem suite: PyTorch eager vs torch.compile, against the roofline.

    python benchmarks/baselines.py --suite problems/level1 --preset ci [--device cuda]
        [--out results.csv] [--markdown results.md] [--include NAME ...]
        [--compile-workers N [--warm-timeout S]]

For every problem: median milliseconds and coefficient of variation of eager and of
``torch.compile`` (default mode), timed in the same process with samples alternated
(eager, compiled, compiled, eager, ...) so that drift and thermal effects hit both; the
problem's FLOPs and minimum bytes (``kforge.problem_cost``); and the roofline floor
``max(flops / peak_flops, bytes / peak_bw)``, with both peaks measured here on the device:
a large device-to-device copy for bandwidth and a large fp32 matmul for the FLOP rate.

``--compile-workers N`` pre-warms torch inductor's on-disk caches before anything is timed:
N subprocesses of this script (``--warm-only``, round-robin shards of the problems) build
each model and its inputs exactly as the timing path does and compile it, all in parallel;
the main process then waits for them, and its own ``torch.compile`` of each problem hits
the FX graph cache. Compile time is never part of the timings, warmed or not.

One failing problem (a load error, an exception while building it, out of memory, eager
failing) never stops the others: it gets a row with ``n/a`` timings and a short note, and
the exit status is 1. The markdown and CSV reports are rewritten after every problem, so a
run cut short still leaves the rows done so far.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import gc
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kforge.problem_cost import flops_and_bytes  # noqa: E402
from kforge.problems import LoadedProblem, ProblemError, load_suite, reference_case  # noqa: E402

SEED = 0
WARMED = "warmed:"  # lines a --warm-only worker prints, one per problem
WARM_FAILED = "warm-failed:"
NAN = float("nan")


@dataclass
class Row:
    problem: str
    category: str
    eager_ms: float
    eager_cv: float
    compiled_ms: float
    compiled_cv: float
    flops: float
    min_bytes: float
    roofline_ms: float
    best_over_roofline: float
    note: str = ""


def failed_row(name: str, category: str, note: str) -> Row:
    return Row(name, category, NAN, 0.0, NAN, 0.0, NAN, NAN, NAN, NAN, note)


@dataclass
class CompileStats:
    """This process's own ``torch.compile`` work (untimed), summed over the problems."""

    problems: int = 0
    seconds: float = 0.0
    fx_hits: int = 0
    fx_misses: int = 0

    def line(self) -> str:
        return (
            f"torch.compile in this process (untimed): {self.seconds:.1f} s over "
            f"{self.problems} problems; FX graph cache {self.fx_hits} hits, "
            f"{self.fx_misses} misses"
        )


@dataclass
class Case:
    """A problem's model and inputs on the device, its eager call and its compiled call."""

    model: torch.nn.Module
    inputs: list[Any]
    eager: Callable[[], Any]
    compiled: Callable[[], Any] | None
    note: str = ""


def cell(text: str, limit: int = 160) -> str:
    """The first line of ``text``, cut to ``limit`` and safe in a markdown table cell."""
    lines = text.strip().splitlines()
    return (lines[0] if lines else "").replace("|", "/")[:limit]


def short_error(exc: BaseException, limit: int = 160) -> str:
    """``Type: first line of the message``, cut to ``limit``, safe in a markdown cell."""
    return cell(f"{type(exc).__name__}: {str(exc).strip()}", limit)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release(device: torch.device) -> None:
    """Free what the previous problem left: compiled code, tensors, cached device memory."""
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def clock(fn: Callable[[], Any], device: torch.device, calls: int) -> float:
    """Milliseconds per call of ``calls`` back-to-back calls."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) * 1e3 / calls


def calls_for(fn: Callable[[], Any], device: torch.device, min_sample_ms: float) -> int:
    """Calls per sample so that one sample lasts at least ``min_sample_ms``."""
    once = max(clock(fn, device, 1), 1e-3)
    return max(1, min(1000, int(min_sample_ms / once) + 1))


def precision_defaults() -> str:
    """The precision switches eager and torch.compile run under (cuDNN TF32 is on by default)."""
    cudnn = torch.backends.cudnn.allow_tf32
    return (f"cuda.matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32}, "
            f"cudnn.allow_tf32={cudnn}" + (" (convolutions on a GPU run in TF32, below strict)" if cudnn else ""))


def measure_peaks(device: torch.device) -> tuple[float, float]:
    """(FLOP/s, bytes/s): the verifier's own peaks (``kforge.verifier.peaks``), measured afresh.

    The FLOP rate is the verifier's matmul ceiling under the strict policy: the faster of a large
    fp32 matmul and half the TF32 rate (error-compensated tf32x3 keeps fp32 accuracy at about that
    speed; measured on the H200 the fp32 rate alone was beaten by eager's own GEMMs, within noise,
    and by TF32 cuDNN convs). The bandwidth is the verifier's ceiling: the best of a
    DRAM copy, a cache-resident copy, a streaming read and, on CUDA, the driver's rated DRAM
    bandwidth. So the roofline column here is the floor the verifier flags candidates against.
    """
    from kforge.verifier.peaks import bandwidth_ceiling, policy_matmul_gflops
    from kforge.verifier.peaks import measure_peaks as device_peaks

    with tempfile.TemporaryDirectory() as cache:  # a fresh measurement, not a cached one
        peaks = device_peaks(device.type, Path(cache))
    return policy_matmul_gflops(peaks, "strict") * 1e9, bandwidth_ceiling(peaks) * 1e9


def stats(samples: list[float]) -> tuple[float, float]:
    median = statistics.median(samples)
    cv = statistics.pstdev(samples) / statistics.mean(samples) if len(samples) > 1 else 0.0
    return median, cv


def prepare_case(problem: LoadedProblem, device: torch.device) -> Case:
    """Seeded model and inputs, one eager call, then ``torch.compile`` and two calls of it.

    Shared by the timing path and the ``--warm-only`` workers, so that both compile the
    same graphs (same seed, device and preset) and the workers' cache entries are hits
    here. Call under ``torch.no_grad()``. A compile failure is a note, not an exception.
    """
    model, inputs = reference_case(problem, seed=SEED, device=device)
    eager = lambda: model(*inputs)  # noqa: E731
    eager()
    try:
        compiled_model = torch.compile(model)
        compiled: Callable[[], Any] | None = lambda: compiled_model(*inputs)  # noqa: E731
        assert compiled is not None
        for _ in range(2):  # compile, then one warm call
            compiled()
    except Exception as exc:  # noqa: BLE001 - report, keep eager numbers
        return Case(model, inputs, eager, None, f"compile failed: {short_error(exc, 200)}")
    return Case(model, inputs, eager, compiled)


def fx_cache_counts() -> tuple[int, int]:
    inductor = torch._dynamo.utils.counters["inductor"]
    return inductor["fxgraph_cache_hit"], inductor["fxgraph_cache_miss"]


def bench_problem(
    problem: LoadedProblem,
    device: torch.device,
    peaks: tuple[float, float],
    reps: int,
    min_sample_ms: float,
    compile_stats: CompileStats | None = None,
) -> Row:
    """Time one problem; raises on any failure other than a compile failure."""
    flops, nbytes = flops_and_bytes(problem)
    roofline_ms = max(flops / peaks[0], nbytes / peaks[1]) * 1e3
    with torch.no_grad():
        hits, misses = fx_cache_counts()
        start = time.perf_counter()
        case = prepare_case(problem, device)
        if compile_stats is not None:
            now_hits, now_misses = fx_cache_counts()
            compile_stats.problems += 1
            compile_stats.seconds += time.perf_counter() - start
            compile_stats.fx_hits += now_hits - hits
            compile_stats.fx_misses += now_misses - misses
        calls = calls_for(case.eager, device, min_sample_ms)
        eager_s: list[float] = []
        compiled_s: list[float] = []
        for rep in range(reps):
            order = [("e", case.eager), ("c", case.compiled)]
            if rep % 2:
                order.reverse()
            for tag, fn in order:
                if fn is None:
                    continue
                (eager_s if tag == "e" else compiled_s).append(clock(fn, device, calls))
    eager_ms, eager_cv = stats(eager_s)
    compiled_ms, compiled_cv = stats(compiled_s) if compiled_s else (NAN, 0.0)
    best = min(eager_ms, compiled_ms) if compiled_s else eager_ms
    return Row(
        problem.name, problem.category, eager_ms, eager_cv, compiled_ms, compiled_cv,
        flops, nbytes, roofline_ms, best / roofline_ms if roofline_ms > 0 else NAN,
        case.note,
    )  # fmt: skip


# --------------------------------------------------------------------------- compile warm-up


def warm_only(args: argparse.Namespace) -> int:
    """Worker mode: compile every selected problem once, print one status line for each."""
    import torch._inductor.config as inductor_config

    # Runtime autotuning (e.g. of Triton reduction configs) here runs beside the other
    # workers; do not persist its choices, so the main process tunes on an idle device.
    # The setting is not part of the FX graph cache key.
    inductor_config.autotune_local_cache = False
    device = torch.device(args.device)
    suite = Path(args.suite)
    problems, errors = load_suite(suite, suite=suite.name, preset=args.preset, include=args.include)
    for err in errors:
        print(f"{WARM_FAILED} {err.name}: load: {err.kind}", flush=True)
    failed = len(errors)
    parent = os.getppid()
    for problem in problems:
        if os.getppid() != parent:  # the main process is gone (killed): stop, leave no orphan
            print(f"{WARM_FAILED} {problem.name}: parent process gone, stopping", flush=True)
            return 1
        start = time.perf_counter()
        try:
            with torch.no_grad():
                case = prepare_case(problem, device)
            if case.compiled is None:
                raise RuntimeError(case.note)
            del case
            print(f"{WARMED} {problem.name} {time.perf_counter() - start:.1f} s", flush=True)
        except Exception as exc:  # noqa: BLE001 - the main process compiles it again
            failed += 1
            print(f"{WARM_FAILED} {problem.name}: {short_error(exc)}", flush=True)
        finally:
            release(device)
    return 0 if failed == 0 else 1


@dataclass
class Worker:
    index: int
    names: list[str]
    log: Path
    proc: subprocess.Popen[bytes]
    timed_out: bool = False
    lines: list[str] = field(default_factory=list)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill a worker started in its own session, with its inductor compile subprocesses."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def warm_up(args: argparse.Namespace, names: list[str]) -> str:
    """Run the ``--warm-only`` workers to completion (or timeout); a one-line summary."""
    n = min(args.compile_workers, len(names))
    if n <= 0:
        return "compile warm-up: none (each problem compiled only in this process, untimed)"
    script = str(Path(__file__).resolve())
    env = dict(os.environ)
    # Share the cores between the workers' inductor compile pools (not in the cache key).
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, (os.cpu_count() or 1) // n)))
    start = time.perf_counter()
    workers: list[Worker] = []
    # The workers run in their own sessions (so that a straggler is killed with its compile
    # subprocesses): a SIGTERM to this process must still take them down, via ``finally``.
    previous = signal.signal(signal.SIGTERM, _exit_on_signal)
    with tempfile.TemporaryDirectory(prefix="kforge-warm-") as tmp:
        try:
            for index in range(n):
                shard = names[index::n]
                cmd = [
                    sys.executable, script, "--warm-only", "--suite", str(args.suite),
                    "--preset", args.preset, "--device", args.device,
                    "--threads", str(args.threads), "--include", *shard,
                ]  # fmt: skip
                log = Path(tmp) / f"worker{index}.log"
                with log.open("wb") as fh:
                    proc = subprocess.Popen(
                        cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
                    )
                workers.append(Worker(index, shard, log, proc))
            deadline = start + args.warm_timeout
            for worker in workers:
                try:
                    worker.proc.wait(timeout=max(deadline - time.perf_counter(), 0.01))
                except subprocess.TimeoutExpired:
                    worker.timed_out = True
                    kill_group(worker.proc)
        finally:
            for worker in workers:
                if worker.proc.poll() is None:
                    kill_group(worker.proc)
            signal.signal(signal.SIGTERM, previous)
        for worker in workers:
            worker.lines = worker.log.read_text(errors="replace").splitlines()
    elapsed = time.perf_counter() - start

    warmed: set[str] = set()
    failed: list[str] = []
    problems: list[str] = []
    for worker in workers:
        for line in worker.lines:
            if line.startswith(WARMED):
                warmed.add(line.split()[1])
            elif line.startswith(WARM_FAILED):
                failed.append(line.split()[1].rstrip(":"))
                print(f"compile warm-up: worker {worker.index}: {line}", file=sys.stderr)
        rc = worker.proc.returncode
        if worker.timed_out:
            problems.append(f"worker {worker.index} timed out (killed)")
        elif rc != 0 and not any(line.startswith(WARM_FAILED) for line in worker.lines):
            problems.append(f"worker {worker.index} exited {rc}")
            tail = "\n".join(worker.lines[-15:])
            print(f"compile warm-up: worker {worker.index} exited {rc}:\n{tail}", file=sys.stderr)
    summary = (
        f"compile warm-up: {n} workers, {elapsed:.1f} s, {len(warmed)}/{len(names)} problems warmed"
    )
    if failed:
        summary += f"; failed: {', '.join(sorted(failed))}"
    if problems:
        summary += f"; {'; '.join(problems)}"
    return summary


# --------------------------------------------------------------------------- reports


def git_commit() -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head


def host_line(device: torch.device) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
    threads = torch.get_num_threads()
    return (
        f"{platform.node()} | {name} | {device.type} | torch {torch.__version__} | "
        f"{threads} threads | {os.cpu_count()} cpus | python {platform.python_version()}"
    )


def fmt(value: float, digits: int = 3) -> str:
    return "n/a" if value != value else f"{value:.{digits}g}"  # NaN check


def table(rows: list[Row]) -> list[str]:
    head = (
        "| problem | category | eager ms | eager CV | compile ms | compile CV | GFLOP | MB | "
        "roofline ms | best/roofline | note |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        lines.append(
            f"| {r.problem} | {r.category} | {fmt(r.eager_ms)} | {r.eager_cv:.1%} | "
            f"{fmt(r.compiled_ms)} | {r.compiled_cv:.1%} | {fmt(r.flops / 1e9)} | "
            f"{fmt(r.min_bytes / 1e6)} | {fmt(r.roofline_ms)} | {fmt(r.best_over_roofline)} | "
            f"{r.note} |"
        )
    return lines


@dataclass
class Report:
    """Everything the reports hold; ``write`` rewrites both files from scratch."""

    title: str
    header: list[str]
    total: int
    errors: list[ProblemError]
    compile_stats: CompileStats
    rows: list[Row] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # "name: error" of problems that failed

    def write(self, csv_path: Path | None, md_path: Path | None, final: bool) -> None:
        if csv_path is not None:
            csv_path.parent.mkdir(parents=True, exist_ok=True)
            with csv_path.open("w", newline="") as fh:
                writer = csv.DictWriter(fh, fieldnames=list(Row.__dataclass_fields__))
                writer.writeheader()
                writer.writerows(asdict(r) for r in self.rows)
        if md_path is None:
            return
        header = [*self.header, self.compile_stats.line()]
        if final:
            header.append(f"load average (1 min) at end: {os.getloadavg()[0]:.2f}")
        else:
            header.append(f"partial report: {len(self.rows)} of {self.total} rows, run in progress")
        body = [self.title, "", *(f"- {line}" for line in header), "", *table(self.rows), ""]
        body += [f"- skipped: {err}" for err in self.errors]
        body += [f"- failed: {failure}" for failure in self.failures]
        md_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = md_path.with_name(md_path.name + ".tmp")
        tmp.write_text("\n".join(body) + "\n")
        tmp.replace(md_path)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--suite", required=True, help="folder of problem files")
    parser.add_argument("--preset", default="ci", help="full | ci | none | a PRESETS name")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--include", nargs="*", default=None, help="problem file stems")
    parser.add_argument("--reps", type=int, default=15, help="samples per variant")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch default)")
    parser.add_argument("--min-sample-ms", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=None, help="CSV file to write")
    parser.add_argument("--markdown", type=Path, default=None, help="markdown report to write")
    parser.add_argument(
        "--compile-workers", type=int, default=0,
        help="subprocesses that pre-warm torch.compile's caches before timing (0: none)",
    )  # fmt: skip
    parser.add_argument(
        "--warm-timeout", type=float, default=600.0,
        help="seconds for the whole warm-up; stragglers are killed",
    )  # fmt: skip
    parser.add_argument("--warm-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda requested but CUDA is not available")
    if args.warm_only:
        return warm_only(args)
    suite = Path(args.suite)
    problems, errors = load_suite(suite, suite=suite.name, preset=args.preset, include=args.include)
    for err in errors:
        print(f"skipped: {err}", file=sys.stderr)
    warm_line = warm_up(args, [p.name for p in problems])  # before anything is timed
    print(warm_line, flush=True)
    peaks = measure_peaks(device)
    header = [
        f"host: {host_line(device)}",
        f"date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M:%S UTC')}",
        f"git commit: {git_commit()}",
        f"suite: {suite} | preset: {args.preset} | reps: {args.reps} alternated, "
        f">= {args.min_sample_ms} ms per sample",
        f"measured peaks: {peaks[0] / 1e9:.1f} GFLOP/s (matmul ceiling under strict: the faster of fp32 "
        f"and TF32 / 2), {peaks[1] / 1e9:.1f} GB/s (best of copy, cache copy, streaming read, rated DRAM)",
        f"baselines run with PyTorch's defaults: {precision_defaults()}",
        f"load average (1 min) at start: {os.getloadavg()[0]:.2f} "
        "(other processes on the host slow every number here)",
        f"{warm_line} (compile time is never part of the timings)",
    ]
    print("\n".join(header), flush=True)
    report = Report(
        f"# Baselines: {suite.name} ({args.preset}, {device.type})",
        header, len(problems) + len(errors), errors, CompileStats(),
    )  # fmt: skip

    def add(row: Row) -> None:
        report.rows.append(row)
        print(table([row])[-1], flush=True)
        report.write(args.out, args.markdown, final=False)

    for err in errors:
        add(failed_row(err.name, "?", cell(f"skipped: {err.kind}: {err.message}")))
    for problem in problems:
        try:
            row = bench_problem(
                problem, device, peaks, args.reps, args.min_sample_ms, report.compile_stats
            )
        except Exception as exc:  # noqa: BLE001 - one problem never stops the others
            row = failed_row(problem.name, problem.category, f"failed: {short_error(exc)}")
            report.failures.append(f"{problem.name}: {short_error(exc, 500)}")
        finally:
            release(device)
        add(row)
    print("\n" + "\n".join(table(report.rows)))
    print(report.compile_stats.line())
    report.write(args.out, args.markdown, final=True)
    return 0 if not errors and not report.failures else 1


if __name__ == "__main__":
    raise SystemExit(main())
