"""``kforge report --html FILE``: the report as one self-contained, offline HTML file.

Charts are matplotlib SVG inlined in the page (no script, no fetch, no font download: text stays
text with ``svg.fonttype = none``): speedup per problem with every failure visible, fast_p
curves per agent / platform / suite / policy, speedup per round, roofline position, cost per
shipped kernel. Tables: the suite summary, precision (tolerances and the winner's errors: the
verifier passes |a - b| <= atol + rtol * |b| elementwise, so max abs err alone can exceed atol),
and one row per cell linking to its provenance chain and kernel source further down the page.
"""

from __future__ import annotations

import datetime as dt
import html
import io
from pathlib import Path
from typing import Any

from kforge.report_view import ReportData
from kforge.summary import FAST_P, fast_p, fast_p_column

COLORS = {"shipped": "#2a9d8f", "no_gain": "#e9c46a", "verified_interpreted": "#8d99ae",
          "compiled_only": "#8d99ae", "unavailable": "#c0c0c0"}
FAIL_COLOR = "#e76f51"
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em;color:#222;max-width:1300px}
table{border-collapse:collapse;margin:1em 0;font-size:13px}th,td{border:1px solid #ccc;padding:3px 7px;text-align:left}
th{background:#f2f2f2}td.num{text-align:right;font-variant-numeric:tabular-nums}
figure.chart{margin:1.5em 0}figure.chart svg{max-width:100%;height:auto}figcaption{font-size:13px;color:#555}
.status-shipped{color:#1d6f65;font-weight:600}.status-fail{color:#b23a1e;font-weight:600}
pre{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:12px}.note{color:#555;font-size:13px}
"""


def _label(r: dict[str, Any], agents: int) -> str:
    who = f"{r['agent']}/" if agents > 1 else ""
    return f"{r['problem']} [{who}{r['platform']}]"


def _color(status: str) -> str:
    return COLORS.get(status, FAIL_COLOR)


def _svg(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _figure(chart_id: str, svg: str, caption: str) -> str:
    return f'<figure class="chart" id="{chart_id}">{svg}<figcaption>{html.escape(caption)}</figcaption></figure>'


def speedup_chart(rows: list[dict[str, Any]]) -> str:
    import matplotlib.pyplot as plt

    agents = len({r["agent"] for r in rows})
    fig, ax = plt.subplots(figsize=(9, 0.8 + 0.32 * len(rows)))
    shown = [r.get("speedup_vs_best") or 0.0 for r in rows]
    highs = [r.get("speedup_high") or 0.0 for r in rows]
    top = max(2.0, min(10.0, max(shown + highs, default=1.0) * 1.15))
    for y, (r, value) in enumerate(zip(rows, shown, strict=True)):
        measured = value > 0
        ax.barh(y, min(value, top) if measured else top * 0.02, color=_color(r["status"]),
                hatch=None if measured else "//", edgecolor="#555" if not measured else None)
        if r.get("speedup_low") is not None and r.get("speedup_high") is not None:  # the paired interval
            low, high = min(r["speedup_low"], top), min(r["speedup_high"], top)
            ax.plot([low, high], [y, y], color="#333", lw=1)
            ax.plot([low, low], [y - 0.25, y + 0.25], color="#333", lw=1)
            ax.plot([high, high], [y - 0.25, y + 0.25], color="#333", lw=1)
        text = f"{value:.2f}x {r['status']}" if measured else r["status"]
        right = min(max(value, r.get("speedup_high") or 0.0), top)  # past the bracket
        ax.text(right + top * 0.01 if measured else top * 0.03, y, text, va="center", fontsize=8)
    ax.axvline(1.0, color="#333", ls="--", lw=1)
    for floor in sorted({r["ship_floor"] for r in rows if r.get("ship_floor")}):
        ax.axvline(floor, color="#999", ls=":", lw=1)
    ax.set_yticks(range(len(rows)), [_label(r, agents) for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.3)
    ax.set_xlabel("paired median speedup over the faster of eager and torch.compile (dashed: 1.0; dotted: ship "
                  "floor; bracket: 95% bounds, ships when the low end clears the floor)")
    ax.set_title("Speedup per problem (hatched: no measured speedup; the status says why)")
    return _figure("chart-speedup", _svg(fig), "Green: shipped; amber: verified, its 95% lower bound short of the floor; "
                   "red: failed, flagged or nondeterministic reference; grey: correct but not timed here.")


def _groups(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(f"{r['agent']}/{r['platform']}/{r['suite']}/{r['policy']}", []).append(r)
    return groups


def fast_p_chart(rows: list[dict[str, Any]]) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8))
    grid = [i / 20 for i in range(0, 121)]
    for name, group in sorted(_groups(rows).items()):
        line = ax.step(grid, [fast_p(group, p) for p in grid], where="post", label=name)[0]
        ax.plot(FAST_P, [fast_p(group, p) for p in FAST_P], "o", color=line.get_color())
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("p (speedup threshold)")
    ax.set_ylabel("fast_p: fraction of ALL problems")
    ax.set_title("fast_p: correct and more than p times faster than the faster baseline")
    ax.legend(fontsize=8)
    return _figure("chart-fastp", _svg(fig), "Dots at p = 0, 1, 1.5, 2, 5; fast_0 is the fraction correct.")


def _round_rows(root: Path) -> list[dict[str, Any]]:
    path = root / "tables" / "profiles.parquet"
    if not path.is_file():
        return []
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    if "profile_candidate_median_ms" not in table.column_names:
        return []
    return [r for r in table.to_pylist() if r.get("profile_candidate_median_ms")]


def rounds_chart(rows: list[dict[str, Any]], root: Path) -> str:
    import matplotlib.pyplot as plt

    base = {(r["agent"], r["platform"], r["suite"], r["problem"]): min(
        b for b in (r.get("eager_ms"), r.get("compile_ms")) if b) for r in rows if r.get("eager_ms") or r.get("compile_ms")}
    lines: dict[tuple[str, ...], list[tuple[int, float]]] = {}
    for p in _round_rows(root):
        key = (p["agent"], p["platform"], p["suite"], p["problem"])
        if key in base:
            lines.setdefault(key, []).append((int(p["round"]), base[key] / p["profile_candidate_median_ms"]))
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for key, points in sorted(lines.items()):
        points.sort()
        ax.plot([x for x, _ in points], [y for _, y in points], "o-", label=f"{key[3]} [{key[1]}]")
    if not lines:
        ax.text(0.5, 0.5, "no verified, profiled rounds yet", ha="center", transform=ax.transAxes)
    ax.axhline(1.0, color="#333", ls="--", lw=1)
    ax.set_xlabel("round")
    ax.set_ylabel("speedup over the faster baseline")
    ax.set_title("Speedup per round (what the analysis agent's advice bought)")
    if lines:
        ax.legend(fontsize=7, ncol=2)
    return _figure("chart-rounds", _svg(fig), "Each round's candidate is profiled alone; the baseline is the "
                   "select stage's same-run time of the faster of eager and torch.compile. Verified rounds only.")


def roofline_chart(rows: list[dict[str, Any]]) -> str:
    import matplotlib.pyplot as plt

    placed = [r for r in rows if r.get("roofline_fraction")]
    agents = len({r["agent"] for r in rows})
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.3 * max(1, len(placed))))
    for y, r in enumerate(placed):
        ax.plot(r["roofline_fraction"], y, "o", color=_color(r["status"]), ms=7)
    ax.set_yticks(range(len(placed)), [_label(r, agents) for r in placed], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="#333", ls="--", lw=1)
    if not placed:
        ax.text(0.5, 0.5, "no timed kernel with a roofline bound", ha="center", transform=ax.transAxes)
    ax.set_xlabel("fraction of the roofline bound reached (1.0 = as fast as the device allows)")
    ax.set_title("Roofline position of each timed kernel")
    return _figure("chart-roofline", _svg(fig), "Roofline time (FLOPs at the fastest allowed matmul rate, bytes at "
                   "the best measured bandwidth) over the kernel's time; shipped kernels in green.")


def cost_chart(summary: list[dict[str, Any]]) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.9 + 0.45 * max(1, len(summary))))
    for y, s in enumerate(summary):
        per = s.get("cost_per_shipped_usd")
        ax.barh(y, per or 0.0, color="#457b9d")
        note = f"USD {per:.4f} per shipped kernel" if per is not None else "nothing shipped"
        ax.text(per or 0.0, y, f"  {note} (total USD {s['cost_usd']:.4f}, {s['total_tokens']} tokens)",
                va="center", fontsize=8)
    ax.set_yticks(range(len(summary)), [f"{s['agent']}/{s['platform']}/{s['suite']}/{s['policy']}" for s in summary],
                  fontsize=8)
    ax.set_xlabel("USD per shipped kernel")
    ax.set_title("Cost per solved (shipped) problem")
    ax.margins(x=0.6)
    return _figure("chart-cost", _svg(fig), "Agent cost (generation and analysis) over the group's shipped kernels.")


def _fmt(value: Any, spec: str = "{:.2f}") -> str:
    if value is None:
        return "-"
    return spec.format(value) if isinstance(value, float) else html.escape(str(value))


def _table(headers: list[str], body: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    rows = "".join("<tr>" + "".join(body_row) + "</tr>" for body_row in body)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _td(value: Any, spec: str = "{:.2f}", cls: str = "num") -> str:
    return f'<td class="{cls}">{_fmt(value, spec)}</td>'


def summary_table(summary: list[dict[str, Any]]) -> str:
    headers = ["agent", "platform", "suite", "policy", "problems", "verified", "shipped", "geomean ALL",
               "geomean shipped only", *[f"fast_{p:g}" for p in FAST_P], "tokens", "cost $", "$ / shipped", "stage s"]
    body = [[_td(s["agent"], cls=""), _td(s["platform"], cls=""), _td(s["suite"], cls=""), _td(s["policy"], cls=""),
             _td(s["problems"]), _td(s["verified"]), _td(s["shipped"]), _td(s["geomean_all"], "{:.2f}x"),
             _td(s["geomean_shipped_only"], "{:.2f}x"), *[_td(s[fast_p_column(p)]) for p in FAST_P],
             _td(s["total_tokens"]), _td(s["cost_usd"], "{:.4f}"), _td(s["cost_per_shipped_usd"], "{:.4f}"),
             _td(s["wall_s"], "{:.1f}")] for s in summary]
    return _table(headers, body)


def cells_table(rows: list[dict[str, Any]]) -> str:
    headers = ["agent", "platform", "problem", "status", "x best", "x low 95%", "answer x", "policy", "atol",
               "rtol", "max abs err", "rel err norm", "err margin", "precision", "verified at", "detail", "chain"]
    body = []
    for i, r in enumerate(rows):
        cls = "status-shipped" if r["status"] == "shipped" else ("" if r["status"] in COLORS else "status-fail")
        body.append([_td(r["agent"], cls=""), _td(r["platform"], cls=""), _td(r["problem"], cls=""),
                     f'<td class="{cls}">{html.escape(r["status"])}</td>', _td(r.get("speedup_vs_best")),
                     _td(r.get("speedup_low")), _td(r.get("shipped_speedup")), _td(r["policy"], cls=""),
                     _td(r.get("atol"), "{:g}"), _td(r.get("rtol"), "{:g}"),
                     _td(r.get("max_abs_err"), "{:.2e}"), _td(r.get("rel_err_norm"), "{:.2e}"),
                     _td(r.get("max_margin"), "{:.3g}"), _td(r.get("precision"), cls=""),
                     _td(r.get("verify_preset"), cls=""),
                     f"<td>{html.escape(str(r.get('detail') or ''))[:160]}</td>",
                     f'<td><a href="#cell-{i}">provenance, source</a></td>'])
    return _table(headers, body)


def cell_sections(rows: list[dict[str, Any]], root: Path) -> str:
    from kforge.provenance import trace_selection
    from kforge.store import Store, StoreError

    store, parts = Store(root), []
    for i, r in enumerate(rows):
        best = root / "runs" / r["agent"] / r["platform"] / r["suite"] / r["problem"] / "best.json"
        chain = "\n".join(trace_selection(store, best).render()) if best.is_file() else "no selection record"
        try:
            source = store.get_text(r["best_source"]) if r.get("best_source") else "(no candidate source)"
        except StoreError as err:
            source = f"(source unavailable: {err})"
        parts.append(
            f'<section id="cell-{i}"><h3>{html.escape(_label(r, 2))}: {html.escape(r["status"])}</h3>'
            f"<details><summary>provenance chain</summary><pre>{html.escape(chain)}</pre></details>"
            f"<details><summary>kernel source (best round {_fmt(r.get('best_round'))})</summary>"
            f"<pre>{html.escape(source)}</pre></details></section>"
        )
    return "\n".join(parts)


def render(data: ReportData) -> str:
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "kforge", "font.size": 9})
    rows = data.rows
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    progress = f'<p class="note"><b>{html.escape(data.progress)}</b></p>' if data.progress else ""
    charts = [speedup_chart(rows), fast_p_chart(rows), rounds_chart(rows, data.root), roofline_chart(rows),
              cost_chart(data.summary)] if rows else ['<p class="note">no cells selected yet</p>']
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>KForge report</title>'
        f'<meta name="viewport" content="width=device-width"><style>{CSS}</style></head><body>'
        f"<h1>KForge report</h1><p class=\"note\">{len(rows)} cells, written {stamp} from {html.escape(str(data.root))}."
        " A row ships only when verified and its paired speedup over the faster of eager and torch.compile has a"
        " 95% lower bound above the floor (1.02x);"
        " every other row's answer is the PyTorch reference (1.0).</p>"
        f"{progress}<h2>Suite summary</h2>{summary_table(data.summary)}"
        f"<h2>Charts</h2>{''.join(charts)}<h2>Cells: precision, error margin, provenance</h2>{cells_table(rows)}"
        f"<h2>Provenance and kernel source per cell</h2>{cell_sections(rows, data.root)}</body></html>\n"
    )


def write_html(data: ReportData, out: Path) -> Path:
    from kforge.store import atomic_write

    atomic_write(out, render(data).encode())
    out.chmod(0o644)
    return out
