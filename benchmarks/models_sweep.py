"""Whole model files through ``kforge model``, one after another, resumable: a table per folder.

    python benchmarks/models_sweep.py run ../shared/kernelbench/level3 --out .models/level3.jsonl
    python benchmarks/models_sweep.py table .models/level3.jsonl > benchmarks/results/models_level3_cpu.md

``run`` calls ``kforge model FILE`` in a process of its own per file (its folder under
``--work``), reads the ``model.json`` it writes and appends one row to the JSONL; files already
in the JSONL are skipped, so a cut sweep resumes. ``--max-distinct N`` leaves a file whose
partition has more than N distinct regions (its pipeline's cost) for a later sweep with a
larger N: the row says so, it counts as not verified, and the next sweep runs it. ``--regions N``
runs such a file anyway, its N distinct regions with the largest share of the forward's time
through the pipeline and the rest as their own ops (``kforge model --regions``); the row says
how many were tried. ``--deadline`` seconds bound the whole sweep: no file starts after it, and a
file still running at it is stopped (its whole process group) and gets no row, so the next sweep
(a later device call) runs it again.

The table: per file how far it got (captured, partitioned, the regions' pipeline, stitched,
verified end to end, timed), its regions (all, distinct, shipped) and the end-to-end speedup
over the faster of eager and torch.compile; below it the counts over every file of the folder
and the geomean where a file without a verified, faster stitched forward counts 1.0.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

NOT_RUN = "not run:"
STAGES = ("capture", "partition", "pipeline", "stitch", "verified", "timed")


def _files(folder: Path, only: set[str]) -> list[Path]:
    files = sorted(folder.glob("*.py"), key=lambda p: (len(p.stem.split("_")[0]), p.stem))
    return [p for p in files if not only or p.stem.split("_")[0] in only]


def _done(out: Path) -> set[str]:
    if not out.is_file():
        return set()
    return {r["file"] for r in _rows(out) if not str(r.get("error", "")).startswith(NOT_RUN)}


def _rows(path: Path) -> list[dict[str, object]]:
    """The JSONL's rows, the last one per file (a file left for later and then run)."""
    rows: dict[str, dict[str, object]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[str(row["file"])] = row
    return list(rows.values())


def _distinct(path: Path, preset: str) -> tuple[int, int, str]:
    """The partition's size before the pipeline runs: (regions, distinct regions, error)."""
    from kforge.models.graph import ModelCaptureError, capture_model
    from kforge.models.partition import partition

    try:
        graph = capture_model(path, preset=preset)
        part = partition(graph.gm, graph.model, graph.inputs)
    except (ModelCaptureError, ValueError, RuntimeError) as err:
        return 0, 0, str(err).splitlines()[0][:300]
    return len(part.regions), len({r.digest for r in part.regions}), ""


def _call(cmd: list[str], timeout: float) -> tuple[int | None, list[str]]:
    """Run ``cmd`` in a session of its own; at ``timeout`` the whole session (its pipeline's
    Snakemake and the jobs under it) is killed. (exit code or None when cut, last output lines)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ), start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, [f"timed out after {timeout:.0f} s"]
    return proc.returncode, out.strip().splitlines()[-3:]


def _execute(path: Path, row: dict[str, object], cmd: list[str], work: Path, regions: int, distinct: int,
             args: argparse.Namespace, start: float) -> dict[str, object] | None:
    """One file's ``kforge model`` run and its row; None where the sweep's deadline cut it."""
    t0 = time.monotonic()
    left = args.deadline - (t0 - start)
    code, tail = _call(cmd, min(args.timeout, left))
    if code is None and left < args.timeout:  # cut by the deadline, not by its own timeout: resumed later
        print(f"deadline: {path.name} stopped after {time.monotonic() - t0:.0f} s, no row", flush=True)
        return None
    row["seconds"] = round(time.monotonic() - t0, 1)
    record = json.loads((work / "model.json").read_text()) if (work / "model.json").is_file() else None
    if record is None:
        row.update(stage="capture", error=" | ".join(tail)[-400:])
    else:
        e2e = record.get("e2e") or {}
        row.update(stage=record["stage"], error=record.get("error", ""), regions=len(record["regions"]) or regions,
                   distinct=record.get("distinct_regions") or distinct, shipped=record.get("shipped_regions", 0),
                   verified=bool(e2e.get("verified")), reason=e2e.get("reason", ""),
                   speedup=e2e.get("speedup"), low=e2e.get("low"), status=e2e.get("status", ""),
                   candidate_ms=e2e.get("candidate_ms"), eager_ms=e2e.get("eager_ms"),
                   compile_ms=e2e.get("compile_ms"), detail=(e2e.get("detail") or "")[:300])
    return row


def run(args: argparse.Namespace) -> int:
    """Each file not in the JSONL yet, ``--jobs`` at a time (each its own ``kforge model`` with
    ``--cores``), a row appended as each ends."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = _done(args.out)
    start = time.monotonic()

    def write(row: dict[str, object] | None) -> None:
        if row is None:
            return
        with args.out.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(f"{row['file']:40} {row.get('stage'):10} verified={row.get('verified', False)} "
              f"{row.get('speedup') or '-'} {row.get('error') or ''}"[:300], flush=True)

    running: set[Future[dict[str, object] | None]] = set()
    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        for path in _files(args.folder, set(args.only.split(",")) if args.only else set()):
            if path.name in done:
                continue
            while len(running) >= max(args.jobs, 1):
                finished, running = wait(running, return_when=FIRST_COMPLETED)
                for f in finished:
                    write(f.result())
            if time.monotonic() - start > args.deadline:
                print(f"deadline: stopping before {path.name}", flush=True)
                break
            row: dict[str, object] = {"file": path.name, "platform": args.platform, "policy": args.policy,
                                      "preset": args.preset}
            regions, distinct, error = _distinct(path, args.preset)
            if args.max_distinct and distinct > args.max_distinct and not args.regions:
                row.update(stage="partition", regions=regions, distinct=distinct,
                           error=f"{NOT_RUN} {distinct} distinct regions > --max-distinct {args.max_distinct}")
                write(row)
                continue
            work = args.work / path.stem
            cmd = [sys.executable, "-m", "kforge.cli", "model", str(path), "--platform", args.platform,
                   "--policy", args.policy, "--preset", args.preset, "--cores", str(args.cores),
                   "--out", str(work), *(["--regions", str(args.regions)] if args.regions else [])]
            if args.regions and distinct > args.regions:
                row["tried"] = args.regions
            running.add(pool.submit(_execute, path, row, cmd, work, regions, distinct, args, start))
        for f in running:
            write(f.result())
    return 0


def table(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = _rows(args.jsonl)  # type: ignore[assignment]
    rows.sort(key=lambda r: (len(r["file"].split("_")[0]), r["file"]))
    if not rows:
        print("no rows")
        return 1
    total = args.total or len(rows)
    print(f"{total} files; platform {rows[0]['platform']}, policy {rows[0]['policy']}, preset {rows[0]['preset']}\n")
    print("| file | stage | regions (distinct) | shipped | e2e verified | e2e speedup (95% low) | stitched ms | eager ms "
          "| compile ms | wall s | note |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        sp = f"{r['speedup']:.2f}x ({r['low']:.2f}x)" if r.get("speedup") else "-"
        ms = [f"{r[k]:.4g}" if r.get(k) else "-" for k in ("candidate_ms", "eager_ms", "compile_ms")]
        note = (r.get("error") or (r.get("detail") if not r.get("verified") else "") or "").replace("|", "/")
        if r.get("tried"):
            note = f"the {r['tried']} largest distinct regions tried (--regions); {note}".rstrip("; ")
        print(f"| {r['file']} | {r['stage']} | {r.get('regions', 0)} ({r.get('distinct', 0)}) | {r.get('shipped', 0)} "
              f"| {'yes' if r.get('verified') else 'no'} | {sp} | {' | '.join(ms)} | {r.get('seconds', '-')} "
              f"| {note[:160]} |")
    reached = {s: sum(STAGES.index(r["stage"]) >= i for r in rows if r["stage"] in STAGES) for i, s in enumerate(STAGES)}
    verified = sum(bool(r.get("verified")) for r in rows)
    faster = [r["speedup"] for r in rows if r.get("verified") and r.get("status") == "shipped" and r.get("speedup")]
    geo = math.exp(sum(math.log(s) for s in faster) / total) if total else 0.0
    partitioned = sum(int(r.get("distinct") or 0) > 0 for r in rows)
    print(f"\nOf {total} files: captured and partitioned {partitioned}, through the regions' pipeline "
          f"{reached['pipeline']}, "
          f"stitched {reached['stitch']}, verified end to end {verified}, timed {reached['timed']}; "
          f"faster than the faster baseline (95% bound above the ship floor) {len(faster)}; "
          f"geomean {geo:.3f}x (a file without a verified faster stitched forward at 1.0)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run")
    p.add_argument("folder", type=Path)
    p.add_argument("--out", type=Path, required=True, help="the JSONL (appended, resumed)")
    p.add_argument("--work", type=Path, default=Path(".models/work"), help="each file's kforge model folder")
    p.add_argument("--platform", default="cpu")
    p.add_argument("--policy", default="strict")
    p.add_argument("--preset", default="ci")
    p.add_argument("--cores", type=int, default=2, help="each file's kforge model --cores")
    p.add_argument("--jobs", type=int, default=1, help="files run at once")
    p.add_argument("--only", default="", help="file id prefixes, comma separated (4,9,44)")
    p.add_argument("--max-distinct", type=int, default=0, help="leave files with more distinct regions for later")
    p.add_argument("--regions", type=int, default=0, help="kforge model --regions N: the N distinct regions with the "
                   "largest share of the forward through the pipeline, the rest their own ops")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per file")
    p.add_argument("--deadline", type=float, default=1e9, help="seconds for the whole sweep: no file starts after it, and one still running at it is "
                   "stopped and left without a row (the next sweep runs it again)")
    p.set_defaults(func=run)
    p = sub.add_parser("table")
    p.add_argument("jsonl", type=Path)
    p.add_argument("--total", type=int, default=0, help="files in the folder (rows missing count as not verified)")
    p.set_defaults(func=table)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
