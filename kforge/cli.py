"""The ``kforge`` command: report, query, ship, audit, provenance, platforms, verify, bench, model,
config checks.

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


def cmd_model(args: argparse.Namespace) -> int:
    """``kforge model MODEL.py``: the model's regions through the pipeline, stitched, end to end."""
    from kforge.models.run import run_model

    path = Path(args.model)
    if not path.is_file():
        print(f"kforge model: {path} not found", file=sys.stderr)
        return 3
    if args.regions is not None and args.regions < 1:
        print(f"kforge model: --regions takes a count of 1 or more, got {args.regions}", file=sys.stderr)
        return 2
    sizes = dict(_size(s) for s in args.size) if args.size else None
    out = Path(args.out) if args.out else Path("artifacts") / "models" / path.stem
    record = run_model(path, out, platform=args.platform, policy=args.policy, preset=args.preset, sizes=sizes,
                       rounds={"functional": args.functional, "optimization": args.optimization}, cores=args.cores,
                       kernels=args.kernels, max_regions=args.regions)
    print(f"{record.model}: {len(record.regions)} regions ({record.distinct_regions} distinct), "
          f"{record.shipped_regions} shipped; stage {record.stage}" + (f": {record.error}" if record.error else ""))
    for r in record.regions:
        ratio = f"{r.speedup:.2f}x" if r.speedup else "-"
        share = f"{r.share:6.1%}" if r.share is not None else "     -"
        print(f"  {r.region:10} {r.problem:16} {r.status:14} {ratio:>7} {share} {r.ops:4} ops  {r.label}")
    e2e = record.e2e
    if e2e is not None:
        timing = (f"; {e2e.candidate_ms:.4g} ms against eager {e2e.eager_ms or 0:.4g} ms, torch.compile "
                  f"{e2e.compile_ms or 0:.4g} ms: {e2e.speedup}x (95% lower bound {e2e.low}x), {e2e.status}"
                  if e2e.candidate_ms else "")
        print(f"end to end: {'VERIFIED' if e2e.verified else 'REJECTED'} {e2e.reason} (max margin "
              f"{e2e.max_margin}){timing}")
    print(f"wrote {out / 'model.json'}")
    return 0 if e2e is not None and e2e.verified else 1


def _size(text: str) -> tuple[str, int]:
    name, _, value = text.partition("=")
    if not value.lstrip("-").isdigit():
        raise SystemExit(f"kforge model: --size takes NAME=INT, got {text!r}")
    return name, int(value)


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
    p = sub.add_parser("model", help="a whole model: its regions through the pipeline, stitched, verified and "
                                     "timed end to end")
    p.add_argument("model", help="a model file in KernelBench format (Model, get_inputs, get_init_inputs)")
    p.add_argument("--platform", default="cpu")
    p.add_argument("--policy", choices=["strict", "relaxed"], default="strict")
    p.add_argument("--preset", default="ci")
    p.add_argument("--size", action="append", default=[], metavar="NAME=INT", help="a size constant of the file")
    p.add_argument("--functional", type=int, default=1, help="repair rounds per region")
    p.add_argument("--optimization", type=int, default=0, help="profile -> analyze -> refine rounds per region")
    p.add_argument("--cores", type=int, default=4, help="Snakemake's --cores for the regions' pipeline")
    p.add_argument("--kernels", choices=["shipped", "verified"], default="shipped",
                   help="which regions the stitched forward gives their kernel: the ship rule's, or every verified one")
    p.add_argument("--regions", type=int, metavar="N", help="only the N distinct regions with the largest share of "
                   "the forward's time through the pipeline; the rest keep their own ops")
    p.add_argument("--out", help="output folder (default artifacts/models/<model>)")
    p.set_defaults(func=cmd_model)
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
