#!/usr/bin/env python3
"""Per-rule wall times of one Snakemake run, from its log (``.snakemake/log/*.snakemake.log``):
jobs, median and total seconds per rule, and the run's span. What docs/CLUSTER.md's
throughput estimates are built from; run it on your own node's log to redo them.

    python3 scripts/cluster/stage_times.py .snakemake/log/2026-12-03T201717.591676.snakemake.log
"""

from __future__ import annotations

import re
import statistics
import sys
from datetime import datetime
from pathlib import Path

STAMP = re.compile(r"^\s*\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]")
START = re.compile(r"^\s*(?:local)?rule (\w+):$")
JOBID = re.compile(r"^\s*jobid: (\d+)$")
DONE = re.compile(r"Finished jobid: (\d+) \(Rule: (\w+)\)")


def stage_times(lines: list[str]) -> dict[str, list[float]]:
    """Seconds from a job's announcement to its 'Finished jobid' line, grouped by rule (for a
    cluster run: submission to the executor noticing the end, queueing and polling included)."""
    now: datetime | None = None
    rule: str | None = None
    started: dict[str, datetime] = {}
    times: dict[str, list[float]] = {}
    for line in lines:
        if m := STAMP.match(line):
            now = datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")
        elif m := START.match(line):
            rule = m.group(1)
        elif (m := JOBID.match(line)) and rule and now:
            started.setdefault(m.group(1), now)
            rule = None
        if (m := DONE.search(line)) and now and m.group(1) in started:
            times.setdefault(m.group(2), []).append((now - started.pop(m.group(1))).total_seconds())
    return times


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print(__doc__, file=sys.stderr)
        return 2
    lines = Path(argv[0]).read_text().splitlines()
    stamps = [datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y") for ln in lines if (m := STAMP.match(ln))]
    times = stage_times(lines)
    if not times:
        print(f"no finished jobs in {argv[0]}", file=sys.stderr)
        return 1
    print(f"{'rule':<12} {'jobs':>4} {'median s':>9} {'total s':>8}")
    for rule, secs in sorted(times.items(), key=lambda kv: -sum(kv[1])):
        print(f"{rule:<12} {len(secs):>4} {statistics.median(secs):>9.1f} {sum(secs):>8.0f}")
    print(f"run span: {(stamps[-1] - stamps[0]).total_seconds():.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
