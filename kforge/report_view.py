"""What ``kforge report`` reads and prints: the report rows (from ``report.parquet``, or from
the ``best.json`` files of a run still in progress) and the suite summary."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class ReportData:
    rows: list[dict[str, Any]]
    summary: list[dict[str, Any]]
    root: Path  # the store root (artifacts/)
    progress: str | None = None  # set when the run is still in progress


def _progress(root: Path, selections: list[Path]) -> str:
    runs = root / "runs"
    cells = [d for d in runs.glob("*/*/*/*") if d.is_dir()]
    rounds = list(runs.glob("*/*/*/*/r[0-9]*"))
    verified = sum(1 for d in rounds if (d / "verify.json").is_file())
    return (f"run in progress: {len(selections)} of {len(cells)} started cells selected so far; "
            f"{verified} of {len(rounds)} started rounds verified (rows below are the selected cells)")


def load_report(path: Path) -> ReportData | None:
    """The finished report, or the cells selected so far when ``best.json`` files are newer than
    the report (or there is no report yet). None when there is nothing at all."""
    import pyarrow.parquet as pq

    from kforge.store import Store
    from kforge.summary import summarize

    root = path.parent
    selections = sorted((root / "runs").glob("*/*/*/*/best.json"))
    done = path.is_file()
    newest = max((p.stat().st_mtime for p in selections), default=0.0)
    if done and newest <= path.stat().st_mtime:
        rows = pq.read_table(path).to_pylist()
        summary_path = path.with_name("summary.parquet")
        fresh = summary_path.is_file() and summary_path.stat().st_mtime >= path.stat().st_mtime
        summary = pq.read_table(summary_path).to_pylist() if fresh else summarize(rows)
        return ReportData(rows, summary, root)
    if not selections and not (root / "runs").is_dir():
        return None
    from kforge.stages.report import report_rows

    rows = report_rows(selections, Store(root))
    return ReportData(rows, summarize(rows), root, progress=_progress(root, selections))


def print_report(data: ReportData, table: str) -> None:
    from kforge.summary import format_summary

    if data.progress:
        print(data.progress, file=sys.stderr)
    print(table)
    print()
    print(format_summary(data.summary) if data.summary else "no cells selected yet")
    statuses: dict[str, int] = {}
    for r in data.rows:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    if statuses:
        print("statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())))
