"""Stages `tables` and `report`: Parquet tables per stage and the summary report.

``artifacts/tables/<kind>.parquet`` holds one row per stage record (candidates, compiles,
verifications, profiles, analyses), plus ``transcripts`` (every agent call) and ``lineage``
(W3C PROV-style edges: entity wasGeneratedBy activity, activity used entity).
``artifacts/report.parquet`` has one row per agent x platform x problem and
``artifacts/summary.parquet`` one row of suite metrics per agent x platform x suite x policy
(``kforge.summary``). All of it can be queried with ``kforge query`` (DuckDB views).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from kforge.stages.context import StageContext
from kforge.stages.records import CandidateRecord, SelectionRecord, VerifyRecord
from kforge.store import Store, StoreError

KINDS = {
    "candidate.json": "candidates",
    "compile.json": "compiles",
    "verify.json": "verifications",
    "profile.json": "profiles",
    "analysis.json": "analyses",
}
TABLES = (*KINDS.values(), "transcripts", "lineage")


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts become ``a_b`` columns; lists become JSON text (stable Parquet types)."""
    row: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and key not in ("used", "extra", "evidence", "tool_versions", "params"):
            row.update(flatten(value, f"{name}_"))
        elif isinstance(value, (dict, list)):
            row[name] = json.dumps(value, sort_keys=True)
        else:
            row[name] = value
    return row


def _run_keys(path: Path, runs: Path) -> dict[str, Any]:
    agent, platform, suite, problem, rdir = path.relative_to(runs).parts[:5]
    return {"agent": agent, "platform": platform, "suite": suite, "problem": problem, "round": int(rdir[1:])}


def _write_table(rows: list[dict[str, Any]], out: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = list(dict.fromkeys(k for r in rows for k in r))  # first-seen order
    table = pa.table({c: [r.get(c) for r in rows] for c in columns}) if rows else pa.table({"empty": pa.array([], pa.int8())})
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp)
    tmp.replace(out)


def run_tables(ctx: StageContext, *, records: list[Path], out_dir: Path) -> None:
    runs = ctx.root / "runs"
    tables: dict[str, list[dict[str, Any]]] = {name: [] for name in TABLES}
    for path in records:
        raw = path.read_bytes()
        data = json.loads(raw)
        digest = hashlib.sha256(raw).hexdigest()
        keys = _run_keys(path, runs)
        tables[KINDS[path.name]].append({**keys, "digest": digest, **flatten(data)})
        activity = f"{data['kind']}:{digest[:16]}"
        tables["lineage"].append({"entity": digest, "relation": "wasGeneratedBy", "other": activity, **keys})
        for role, used in sorted(data.get("used", {}).items()):
            tables["lineage"].append({"entity": activity, "relation": f"used:{role}", "other": used, **keys})
        for field in ("source", "parent", "transcript", "plan", "log"):
            if data.get(field):
                tables["lineage"].append({"entity": activity, "relation": f"used:{field}", "other": data[field], **keys})
        if data.get("transcript"):
            t = ctx.store.get_json(data["transcript"])
            usage = t.pop("usage", {})
            tables["transcripts"].append({
                **keys, "digest": data["transcript"], "agent_name": t["agent"], "model": t["model"], "role": t["role"],
                "prompt_tokens": usage.get("prompt_tokens", 0), "completion_tokens": usage.get("completion_tokens", 0),
                "cost_usd": usage.get("cost_usd", 0.0), "latency_s": t.get("latency_s", 0.0),
                "litellm_version": t.get("litellm_version"), "request_digest": t.get("request_digest", ""),
                "error": t.get("error"), "messages": json.dumps(t["messages"]), "response": t["response"],
            })
    for name, rows in tables.items():
        _write_table(rows, out_dir / f"{name}.parquet")


REPORT_COLUMNS = (
    "agent", "platform", "suite", "problem", "status", "policy", "rounds_used", "best_round", "best_candidate",
    "best_source", "candidate_ms", "eager_ms", "compile_ms", "speedup_vs_eager", "speedup_vs_compile",
    "speedup_vs_best", "candidate_cv", "device", "prompt_tokens", "completion_tokens", "cost_usd", "wall_s",
    "transfer_from", "detail", "verified", "shipped", "shipped_speedup", "speedup_low", "speedup_high",
    "ship_floor", "eager_cv", "compile_cv", "selection_profile", "inputs",
)


def report_row(path: Path, store: Store) -> dict[str, Any]:
    """One report row from a ``best.json``: the selection, plus the winner's errors and error
    margin (``max_margin``: the worst case's max error / allowed error, from its verify record),
    the sizes it was verified at (``verify_preset``), the precision step its plan recorded
    (``precision``) and its roofline position (its same-run timing profile), where there is one."""
    raw = path.read_bytes()
    record = SelectionRecord.model_validate_json(raw)
    data = record.model_dump(mode="json")
    row: dict[str, Any] = {c: data[c] for c in REPORT_COLUMNS}
    row.update({"selection": hashlib.sha256(raw).hexdigest(), "run_dir": str(path.parent), "kernel_path": None,
                "atol": None, "rtol": None, "max_abs_err": None, "rel_err_norm": None, "max_margin": None,
                "verify_preset": None, "precision": None, "roofline_ms": None, "roofline_fraction": None})
    if record.best_round is not None:
        rdir = path.parent / f"r{record.best_round}"
        row["kernel_path"] = str(rdir / "kernel.py")
        if (rdir / "verify.json").is_file():
            verified = VerifyRecord.model_validate_json((rdir / "verify.json").read_bytes())
            verdict = verified.verdict
            row.update(atol=verdict.atol, rtol=verdict.rtol, max_abs_err=verdict.max_abs_err,
                       rel_err_norm=verdict.rel_err_norm, max_margin=verdict.max_margin,
                       verify_preset=verdict.preset or verified.preset or None)
        row["precision"] = plan_precision(rdir / "candidate.json", store)
    if record.selection_profile and record.candidate_ms:
        try:
            roofline = float(store.get_json(record.selection_profile).get("roofline_ms") or 0.0)
        except StoreError:
            roofline = 0.0
        if roofline > 0:  # 1.0: at the roofline; 0.1: ten times slower than the device allows
            row.update(roofline_ms=roofline, roofline_fraction=round(roofline / record.candidate_ms, 4))
    return row


def plan_precision(candidate: Path, store: Store) -> str | None:
    """The precision step the candidate's plan recorded: the dominant kernel's
    ``knobs[dominant]["precision"]`` (the fusion compiler's plan), else the plan's own
    ``precision`` field (the cuda pattern path); None when the plan names none."""
    try:
        plan = store.get_json(CandidateRecord.model_validate_json(candidate.read_bytes()).plan)
    except (OSError, ValueError, StoreError):
        return None
    if not isinstance(plan, dict):
        return None
    knobs, dominant = plan.get("knobs"), plan.get("dominant")
    if isinstance(knobs, dict) and isinstance(knobs.get(dominant), dict) and knobs[dominant].get("precision"):
        return str(knobs[dominant]["precision"])
    return str(plan["precision"]) if plan.get("precision") else None


def report_rows(selections: list[Path], store: Store) -> list[dict[str, Any]]:
    rows = [report_row(path, store) for path in selections]
    rows.sort(key=lambda r: (r["agent"], r["platform"], r["suite"], r["problem"]))
    return rows


def run_report(ctx: StageContext, *, selections: list[Path], out: Path, summary_out: Path | None = None) -> None:
    """``report.parquet`` (one row per cell) and beside it ``summary.parquet`` (suite metrics)."""
    from kforge.summary import summarize

    rows = report_rows(selections, ctx.store)
    _write_table(rows, out)
    _write_table(summarize(rows), summary_out or out.with_name("summary.parquet"))
