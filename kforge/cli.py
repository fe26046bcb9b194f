"""The ``kforge`` command: report, query, ship, audit, provenance, platforms, verify, config checks.

The pipeline itself runs through Snakemake (``snakemake --cores 4 artifacts/report.parquet``);
this command reads what it produced and offers the verifier on its own.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPORT_VIEW = (
    ("agent", "agent", "{}"), ("platform", "platform", "{}"), ("problem", "problem", "{}"),
    ("status", "status", "{}"), ("policy", "policy", "{}"), ("rounds_used", "rounds", "{}"),
    ("candidate_ms", "cand ms", "{:.4f}"), ("eager_ms", "eager ms", "{:.4f}"),
    ("compile_ms", "compile ms", "{:.4f}"), ("speedup_vs_eager", "x eager", "{:.2f}"),
    ("speedup_vs_compile", "x compile", "{:.2f}"), ("speedup_vs_best", "x best", "{:.2f}"),
    ("speedup_low", "x low 95%", "{:.2f}"), ("shipped_speedup", "answer x", "{:.2f}"),
    ("max_margin", "err margin", "{:.3g}"), ("precision", "precision", "{}"), ("verify_preset", "verified at", "{}"),
    ("prompt_tokens", "tok in", "{}"), ("completion_tokens", "tok out", "{}"),
    ("cost_usd", "cost $", "{:.4f}"), ("wall_s", "wall s", "{:.1f}"),
)


def format_table(rows: list[dict[str, object]]) -> str:
    cells = [[h for _, h, _ in REPORT_VIEW]]
    for row in rows:
        line = []
        for key, _, fmt in REPORT_VIEW:
            value = row.get(key)
            line.append("-" if value is None else fmt.format(value))
        cells.append(line)
    widths = [max(len(r[i]) for r in cells) for i in range(len(REPORT_VIEW))]
    out = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def cmd_report(args: argparse.Namespace) -> int:
    from kforge.report_view import load_report, print_report

    path = Path(args.path)
    data = load_report(path)
    if data is None:
        print(f"kforge report: {path} not found; run `snakemake --cores 4 {path}` first", file=sys.stderr)
        return 2
    print_report(data, format_table(data.rows))
    if args.html:
        from kforge.html_report import write_html

        out = write_html(data, Path(args.html))
        print(f"wrote {out}")
    return 0


def cmd_provenance(args: argparse.Namespace) -> int:
    """The chain behind each matching selection on stdout; on stderr one line per broken link
    (role, digest prefix, what is wrong). Exit 0: every link holds; 1: a link is broken (a blob
    or record whose bytes no longer hash to their sha256, or a missing one); 2: nothing matches
    the query."""
    from kforge.provenance import ProvenanceError, find_selections, trace_selection
    from kforge.store import Store

    root = Path(args.store)
    store = Store(root)
    try:
        selections = find_selections(root, args.query)
    except ProvenanceError as err:
        print(f"kforge provenance: {err}", file=sys.stderr)
        return 2
    seen: set[tuple[str, str]] = set()
    for best in selections:
        chain = trace_selection(store, best)
        print("\n".join(chain.render()))
        for link in chain.broken():
            if (link.role, link.digest) not in seen:  # a blob two rounds share is one broken link
                seen.add((link.role, link.digest))
                print(f"broken link: {link.role} {link.digest[:16]}: {link.note}", file=sys.stderr)
        print()
    return 1 if seen else 0


def cmd_platforms(args: argparse.Namespace) -> int:
    from kforge.platforms import KNOWN_PLATFORMS, get_platform

    rows = [("platform", "language", "builds", "runs", "note")]
    for name in KNOWN_PLATFORMS:
        info = get_platform(name).describe()
        runs = "interpreted" if info.runnable and info.interpreted else ("yes" if info.runnable else "no")
        note = info.reason + (f" (missing: {', '.join(info.missing)})" if info.missing else "")
        rows.append((name, info.language, "yes" if info.can_build else "no", runs, note))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[4])
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from kforge.config import ConfigError, load_config

    try:
        config = load_config(args.path)
    except ConfigError as err:
        print(f"kforge config: {err}", file=sys.stderr)
        return 2
    print(f"{args.path}: valid; runs agents {config.run.agents} on platforms {config.run.platforms} "
          f"over suites {config.run.suites}, {config.rounds.total} rounds, policy {config.policy}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["verify"]:
        from kforge.verifier.cli import main as verify_main

        return verify_main(argv[1:])
    if argv[:1] == ["bench"]:
        from kforge.verifier.cli import bench_main

        return bench_main(argv[1:])
    parser = argparse.ArgumentParser(prog="kforge", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("report", help="print the report as a table")
    p.add_argument("path", nargs="?", default="artifacts/report.parquet")
    p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report (charts inline)")
    p.set_defaults(func=cmd_report)
    from kforge.query import add_query_parser
    from kforge.ship import add_ship_parsers

    add_query_parser(sub)
    add_ship_parsers(sub)
    p = sub.add_parser("provenance", help="the chain of artifacts behind a kernel, integrity-checked",
                       description="Re-hash every record and blob behind a selection, read-only.",
                       epilog="exit status: 0 every link holds, 1 a broken link (named on stderr), "
                              "2 nothing matches the query")
    p.add_argument("query", help="a problem name or a digest prefix (selection, candidate or source)")
    p.add_argument("--store", default="artifacts")
    p.set_defaults(func=cmd_provenance)
    p = sub.add_parser("platforms", help="every platform, whether it builds and runs here, and why not")
    p.set_defaults(func=cmd_platforms)
    p = sub.add_parser("config", help="validate a configuration file")
    p.add_argument("path", nargs="?", default="kforge.yaml")
    p.set_defaults(func=cmd_config)
    sub.add_parser("verify", help="build, then verify CANDIDATE.py --problem PROBLEM.py [--platform P] [--policy strict]")
    sub.add_parser("bench", help="verify, then time CANDIDATE.py against eager and torch.compile [--json]")
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
