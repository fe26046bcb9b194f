"""``kforge query "SQL"``: DuckDB over named views of every table a run writes.

Views (each ``read_parquet(..., union_by_name=true)``, so tables written by different versions
with different columns still read as one): ``report`` and ``summary`` (``artifacts/*.parquet``),
and the stage tables under ``artifacts/tables/``: ``candidates``, ``compiles``,
``verifications``, ``profiles``, ``analyses``, ``transcripts``, ``lineage``. A view whose file
is missing is left out (``--schema`` says so).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

TOP_VIEWS = ("report", "summary")
TABLE_VIEWS = ("candidates", "compiles", "verifications", "profiles", "analyses", "transcripts", "lineage")


def view_files(store: Path) -> dict[str, Path]:
    files = {name: store / f"{name}.parquet" for name in TOP_VIEWS}
    files.update({name: store / "tables" / f"{name}.parquet" for name in TABLE_VIEWS})
    return files


def connect(store: Path) -> tuple[Any, list[str]]:
    """An in-memory DuckDB connection with one view per table present; and the missing ones."""
    import duckdb

    con = duckdb.connect(":memory:")
    missing = []
    for name, path in view_files(store).items():
        if not path.is_file():
            missing.append(name)
            continue
        literal = str(path.resolve()).replace("'", "''")
        con.execute(f"create view {name} as select * from read_parquet('{literal}', union_by_name=true)")
    return con, missing


def run_query(store: Path, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    con, _ = connect(store)
    rel = con.execute(sql)
    columns = [d[0] for d in rel.description] if rel.description else []
    return columns, rel.fetchall()


def schema(store: Path) -> str:
    con, missing = connect(store)
    lines = []
    for name in (*TOP_VIEWS, *TABLE_VIEWS):
        if name in missing:
            lines.append(f"{name}: missing ({view_files(store)[name]} not found; run the pipeline)")
            continue
        cols = con.execute(f"describe {name}").fetchall()
        count = con.execute(f"select count(*) from {name}").fetchone()[0]
        lines.append(f"{name} ({count} rows): " + ", ".join(f"{c[0]} {c[1]}" for c in cols))
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def format_rows(columns: list[str], rows: list[tuple[Any, ...]]) -> str:
    cells = [columns] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    out = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def cmd_query(args: argparse.Namespace) -> int:
    import duckdb

    store = Path(args.store)
    if args.schema:
        print(schema(store))
        return 0
    if not args.sql:
        print("kforge query: give SQL (or --schema to list the views)", file=sys.stderr)
        return 2
    try:
        columns, rows = run_query(store, args.sql)
    except duckdb.Error as err:
        _, missing = connect(store)
        hint = f" (views missing here: {', '.join(missing)})" if missing else ""
        print(f"kforge query: {err}{hint}", file=sys.stderr)
        return 2
    if args.csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        writer.writerows(rows)
    elif args.json:
        print(json.dumps([dict(zip(columns, r, strict=True)) for r in rows], default=str, indent=1))
    else:
        print(format_rows(columns, rows))
    return 0


def add_query_parser(sub: Any) -> None:
    p = sub.add_parser("query", help="SQL (DuckDB) over views of the report, summary and stage tables")
    p.add_argument("sql", nargs="?", help='e.g. "select problem, status from report"')
    p.add_argument("--store", default="artifacts")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true", help="CSV on stdout")
    fmt.add_argument("--json", action="store_true", help="a JSON list of objects on stdout")
    fmt.add_argument("--schema", action="store_true", help="list the views and their columns")
    p.set_defaults(func=cmd_query)
