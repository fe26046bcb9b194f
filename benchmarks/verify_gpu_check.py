"""The verifier's GPU rows of issue 15 on a CUDA host: correctness at the timed size compared on
the device, and timing a candidate cannot forge, through the real verifier and timing paths.

    python benchmarks/verify_gpu_check.py [--out DIR] [--reps 20]

Problem: tests/verifier/fixtures/softmax_gpu.py (8192 x 4096 fp32 at ``full``). Candidates:
tests/verifier/gpu_offenders.py (Triton, each launching a real kernel):

- verification at ``full``, outputs compared on the GPU by the trusted judge over CUDA IPC
  (``gpu_compare.py``): the honest control passes; INDEX_BUG (rows past 4096 never written),
  STALE_AFTER_N and CACHE_BY_PTR are rejected; INDEX_BUG also at ``ci`` (compared on the host),
  where it passes: what a ci-only verification would have shipped;
- timing at ``full`` (``profile_candidate``: the candidate, eager and torch.compile each in a
  process of its own, the parent's handshake bounding the events): the honest control, the slow
  honest kernel, the same kernel with CUDA's event timer forged from inside its process
  (CLOCK_FORGE: the parent's clock sees through it), and the two stale offenders.

Prints a table and writes ``verify_gpu_check.json`` / ``.md`` under ``--out``. Exits 2 without
CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _host() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"host": platform.node(), "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
                            "torch": torch.__version__, "python": platform.python_version()}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = "absent"
    info["gpu"] = torch.cuda.get_device_name(0)
    commit = os.environ.get("KFORGE_COMMIT") or subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    info["commit"] = commit or "unknown"
    return info


_CHILD = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from kforge.verifier.gpu_compare import compare_on_device, import_cuda
meta = json.loads(sys.stdin.read())
t = import_cuda(meta)
r = compare_on_device(t, torch.arange(1 << 20, device="cuda", dtype=torch.float32), 1e-4)
print(json.dumps({"kind": r.kind, "max_abs_err": r.max_abs_err}))
"""


def ipc_selftest() -> dict[str, Any]:
    """CUDA IPC between two plain processes (no sandbox): tells a host without IPC from a
    sandbox problem."""
    import torch

    from kforge.verifier.gpu_compare import export_cuda

    t = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(ROOT)], input=json.dumps(export_cuda(t)),
                          capture_output=True, text=True, timeout=120)
    return {"rc": proc.returncode, "out": proc.stdout.strip()[-300:], "err": proc.stderr.strip()[-600:],
            "seconds": round(time.monotonic() - start, 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--only", default="", help="rows whose candidate name contains this")
    p.add_argument("--timeout", type=float, default=90.0, help="seconds per verification job (x2 on the device)")
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("verify_gpu_check: no CUDA device here", file=sys.stderr)
        return 2
    from kforge.verifier.profiling import profile_candidate
    from kforge.verifier.verify import verify_candidate
    from tests.verifier import gpu_offenders as off

    rows: list[dict[str, Any]] = []
    selftest = ipc_selftest()
    print("ipc selftest:", json.dumps(selftest), flush=True)

    def row(kind: str, name: str, expect: str, **data: Any) -> None:
        data.update(kind=kind, candidate=name, expect=expect)
        data["pass"] = data.get("reason") in expect.split("|")
        rows.append(data)
        print(json.dumps(data, default=str), flush=True)

    # Any rejection that names what is wrong counts: the unwritten rows of INDEX_BUG hold what
    # the allocator left (NaN on the H200: nonfinite), and CACHE_BY_PTR's cache answers the
    # verifier's scaled case (same buffer, new contents) before the repeat phase sees it.
    verifications = [("HONEST", "ok"), ("INDEX_BUG", "output_mismatch|nonfinite"), ("STALE_AFTER_N", "stale_output"),
                     ("CACHE_BY_PTR", "stale_output|output_mismatch")]
    for name, expect in verifications:
        if args.only not in name:
            continue
        if selftest["rc"] != 0:  # no CUDA IPC on this host: the rows would only time out
            row("verify full", name, expect, reason="skipped: no CUDA IPC here", seconds=0)
            continue
        t = time.monotonic()
        v = verify_candidate(getattr(off, name), off.PROBLEM, platform="triton", policy="strict", preset="full",
                             timeout_s=args.timeout)
        row("verify full", name, expect, reason=v.reason, compared_on=v.compared_on, preset=v.preset,
            max_margin=v.max_margin, cases=len(v.margins), seconds=round(time.monotonic() - t, 1),
            detail=v.detail[:240])
    if args.only in "INDEX_BUG":
        t = time.monotonic()
        v = verify_candidate(off.INDEX_BUG, off.PROBLEM, platform="triton", policy="strict", preset="ci",
                             compare="host", timeout_s=args.timeout)
        row("verify ci (host)", "INDEX_BUG", "ok", reason=v.reason, compared_on=v.compared_on, preset=v.preset,
            max_margin=v.max_margin, seconds=round(time.monotonic() - t, 1), detail=v.detail[:240])
    timings = [("HONEST", "ok"), ("SLOW_HONEST", "ok"), ("CLOCK_FORGE", "timing_inconsistent"),
               ("STALE_AFTER_N", "stale_output"), ("CACHE_BY_PTR", "stale_output")]
    for name, expect in timings:
        if args.only not in name:
            continue
        t = time.monotonic()
        prof = profile_candidate(getattr(off, name), off.PROBLEM, platform="triton", preset="full",
                                 baselines=True, reps=args.reps, timeout_s=2 * args.timeout)
        cand = prof.candidate
        row("time full", name, expect,
            reason=prof.reason if not prof.ok else "ok", ms=cand and round(cand.median_ms, 4),
            cv=cand and round(cand.cv, 4), gap_us=prof.extra.get("clock_gap_us"),
            hop_us=prof.extra.get("clock_hop_us"), seconds=round(time.monotonic() - t, 1), detail=prof.detail[:240])
    host = _host()
    lines = [f"host {host['host']} ({host['gpu']}), {host['date']}, commit {host['commit']}, torch {host['torch']}, "
             f"triton {host['triton']}, Python {host['python']}", "",
             "| check | candidate | expected | got | ok | compared on / ms | margin / gap us | s | detail |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        where = r.get("compared_on") or ("-" if r.get("ms") is None else f"{r['ms']:.4f} ms (cv {r['cv']:.3f})")
        margin = r.get("max_margin") if "max_margin" in r else r.get("gap_us")
        detail = str(r.get("detail", "")).replace("|", "/").replace("\n", " ")[:140]
        lines.append(f"| {r['kind']} | {r['candidate']} | {r['expect']} | {r['reason']} | "
                     f"{'yes' if r['pass'] else 'NO'} | {where} | {margin} | {r['seconds']} | {detail} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "verify_gpu_check.json").write_text(
            json.dumps({"host": host, "ipc_selftest": selftest, "rows": rows}, indent=1, default=str))
        (args.out / "verify_gpu_check.md").write_text(text + "\n")
    return 0 if all(r["pass"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
