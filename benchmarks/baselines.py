"""Baseline timings of a problem suite: PyTorch eager vs torch.compile, against the roofline.

    python benchmarks/baselines.py --suite problems/level1 --preset ci [--device cuda]
        [--out results.csv] [--markdown results.md] [--include NAME ...]

For every problem: median milliseconds and coefficient of variation of eager and of
``torch.compile`` (default mode), timed in the same process with samples alternated
(eager, compiled, compiled, eager, ...) so that drift and thermal effects hit both; the
problem's FLOPs and minimum bytes (``kforge.problem_cost``); and the roofline floor
``max(flops / peak_flops, bytes / peak_bw)``, with both peaks measured here on the device:
a large device-to-device copy for bandwidth and a large fp32 matmul for the FLOP rate.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kforge.problem_cost import flops_and_bytes  # noqa: E402
from kforge.problems import LoadedProblem, load_suite, reference_case  # noqa: E402


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


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


def measure_peaks(device: torch.device) -> tuple[float, float]:
    """(FLOP/s of a large fp32 matmul, bytes/s of a large copy): best of several runs.

    The copy is sized far beyond any cache, so the bandwidth is the DRAM (HBM) one; a
    ci-sized problem that fits in cache can therefore run below its roofline floor.
    """
    n_copy = (1 << 28) if device.type == "cuda" else (1 << 26)  # 1 GiB / 256 MiB of fp32
    src = torch.empty(n_copy, device=device).uniform_()
    dst = torch.empty_like(src)
    copy_ms = [clock(lambda: dst.copy_(src), device, 3) for _ in range(7)]
    bandwidth = 2 * src.numel() * src.element_size() / (min(copy_ms[1:]) * 1e-3)
    n = 8192 if device.type == "cuda" else 2048
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    calls = 3 if device.type == "cuda" else 1
    mm_ms = [clock(lambda: torch.mm(a, b), device, calls) for _ in range(6)]
    flop_rate = 2 * n**3 / (min(mm_ms[1:]) * 1e-3)  # first run is warm-up
    return flop_rate, bandwidth


def stats(samples: list[float]) -> tuple[float, float]:
    median = statistics.median(samples)
    cv = statistics.pstdev(samples) / statistics.mean(samples) if len(samples) > 1 else 0.0
    return median, cv


def bench_problem(
    problem: LoadedProblem,
    device: torch.device,
    peaks: tuple[float, float],
    reps: int,
    min_sample_ms: float,
) -> Row:
    flops, nbytes = flops_and_bytes(problem)
    roofline_ms = max(flops / peaks[0], nbytes / peaks[1]) * 1e3
    model, inputs = reference_case(problem, seed=0, device=device)
    note = ""
    with torch.no_grad():
        eager = lambda: model(*inputs)  # noqa: E731
        eager()
        try:
            compiled_model = torch.compile(model)
            compiled: Callable[[], Any] | None = lambda: compiled_model(*inputs)  # noqa: E731
            assert compiled is not None
            for _ in range(2):  # compile, then one warm call
                compiled()
        except Exception as exc:  # noqa: BLE001 - report, keep eager numbers
            compiled, note = None, f"compile failed: {type(exc).__name__}: {exc}"[:200]
        calls = calls_for(eager, device, min_sample_ms)
        eager_s: list[float] = []
        compiled_s: list[float] = []
        for rep in range(reps):
            order = [("e", eager), ("c", compiled)]
            if rep % 2:
                order.reverse()
            for tag, fn in order:
                if fn is None:
                    continue
                (eager_s if tag == "e" else compiled_s).append(clock(fn, device, calls))
    eager_ms, eager_cv = stats(eager_s)
    compiled_ms, compiled_cv = stats(compiled_s) if compiled_s else (float("nan"), 0.0)
    best = min(eager_ms, compiled_ms) if compiled_s else eager_ms
    return Row(
        problem.name, problem.category, eager_ms, eager_cv, compiled_ms, compiled_cv,
        flops, nbytes, roofline_ms, best / roofline_ms if roofline_ms > 0 else float("nan"),
        note,
    )  # fmt: skip


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", required=True, help="folder of problem files")
    parser.add_argument("--preset", default="ci", help="full | ci | none | a PRESETS name")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--include", nargs="*", default=None, help="problem file stems")
    parser.add_argument("--reps", type=int, default=15, help="samples per variant")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch default)")
    parser.add_argument("--min-sample-ms", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=None, help="CSV file to write")
    parser.add_argument("--markdown", type=Path, default=None, help="markdown report to write")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda requested but CUDA is not available")
    suite = Path(args.suite)
    problems, errors = load_suite(suite, suite=suite.name, preset=args.preset, include=args.include)
    for err in errors:
        print(f"skipped: {err}", file=sys.stderr)
    peaks = measure_peaks(device)
    header = [
        f"host: {host_line(device)}",
        f"date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M:%S UTC')}",
        f"git commit: {git_commit()}",
        f"suite: {suite} | preset: {args.preset} | reps: {args.reps} alternated, "
        f">= {args.min_sample_ms} ms per sample",
        f"measured peaks: {peaks[0] / 1e9:.1f} GFLOP/s (fp32 matmul), "
        f"{peaks[1] / 1e9:.1f} GB/s (copy)",
        f"load average (1 min) at start: {os.getloadavg()[0]:.2f} "
        "(other processes on the host slow every number here)",
    ]
    print("\n".join(header), flush=True)
    rows: list[Row] = []
    for problem in problems:
        row = bench_problem(problem, device, peaks, args.reps, args.min_sample_ms)
        rows.append(row)
        print(table([row])[-1], flush=True)
    lines = table(rows)
    print("\n" + "\n".join(lines))
    if args.out is not None:
        with args.out.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(asdict(rows[0]) if rows else []))
            writer.writeheader()
            writer.writerows(asdict(r) for r in rows)
    if args.markdown is not None:
        body = [f"# Baselines: {suite.name} ({args.preset}, {device.type})", ""]
        header.append(f"load average (1 min) at end: {os.getloadavg()[0]:.2f}")
        body += [f"- {line}" for line in header] + ["", *lines, ""]
        body += [f"- skipped: {err}" for err in errors]
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text("\n".join(body) + "\n")
    return 0 if not errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
