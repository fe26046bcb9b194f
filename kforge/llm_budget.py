"""Prices and spend: what a call cost (or that nobody knows), and the per-agent spend cap.

- **Price**: the config override (``input_cost_per_token`` / ``output_cost_per_token``; 0.0
  for local models) when set (computed here, never registered into litellm's global table,
  so one agent's override cannot price another's model), else litellm's bundled table. A model neither prices is
  *unknown*: its cost is ``None`` in the transcript, never 0.0.
- **Spend ledger**: every paid call (cache misses only: a replayed call costs nothing) appends
  one line to ``<store>/llm/spend/<agent>.jsonl`` (``O_APPEND``: whole lines, whatever the
  number of processes).
- **Cap** (``budget_usd`` in the agent's config): before a call is paid, the agent's spend in
  this store is summed; at or over the cap, :class:`LLMBudgetError` is raised and a
  ``budget_stop`` line written, so the report can say the run was stopped. A cap needs known
  prices: a model without one under a cap is refused before any call. Calls in flight when
  the cap is reached finish, so the overshoot is at most ``concurrency`` calls.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from kforge.config import AgentConfig
from kforge.llm_errors import LLMBudgetError
from kforge.schema import Usage


def _overridden(config: AgentConfig) -> bool:
    return config.input_cost_per_token is not None or config.output_cost_per_token is not None


def price_known(litellm: Any, config: AgentConfig) -> bool:
    """Can this model's calls be priced (override, or litellm's table)?"""
    if _overridden(config):
        return True
    try:
        info = litellm.get_model_info(model=config.model)
    except Exception:  # unmapped model
        return False
    return info.get("input_cost_per_token") is not None


def call_cost(litellm: Any, response: Any, config: AgentConfig, usage: Usage) -> float | None:
    """USD for one response; None when nobody knows the price (never a made-up 0.0)."""
    if _overridden(config):
        return (
            usage.prompt_tokens * (config.input_cost_per_token or 0.0)
            + usage.completion_tokens * (config.output_cost_per_token or 0.0)
        )
    if not price_known(litellm, config):
        return None
    try:
        cost = litellm.completion_cost(completion_response=response, model=config.model)
    except Exception:  # litellm raises bare Exceptions for unmapped models
        return None
    return float(cost) if cost is not None else None


# --------------------------------------------------------------------------- ledger


def spend_path(root: Path, agent: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", agent) or "_"
    return Path(root) / "llm" / "spend" / f"{safe}.jsonl"


def _append(path: Path, line: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    out = []
    for text in path.read_text().splitlines():
        try:
            out.append(json.loads(text))
        except ValueError:
            continue  # a line cut by a crash: skip it
    return out


def record_spend(root: Path, agent: str, *, model: str, cost: float | None, key: str) -> None:
    _append(spend_path(root, agent), {"event": "call", "model": model, "cost_usd": cost,
                                      "request": key, "time": round(time.time(), 3)})


def spent(root: Path, agent: str) -> float:
    """USD this store has paid for ``agent`` (known prices only)."""
    return sum(
        float(line.get("cost_usd") or 0.0)
        for line in _lines(spend_path(root, agent))
        if line.get("event") == "call"
    )


def check_budget(root: Path, agent: str, config: AgentConfig, litellm: Any) -> None:
    """Raise :class:`LLMBudgetError` (and record a ``budget_stop``) if the next call may not be
    paid: the cap is reached, or the cap cannot be kept because the price is unknown."""
    if config.budget_usd is None:
        return
    kw: dict[str, Any] = {"model": config.model, "api_base": config.api_base}
    if not price_known(litellm, config):
        message = (
            f"agent {agent!r}: budget_usd is set but the price of {config.model!r} is unknown, "
            f"so the cap cannot be kept; set input_cost_per_token and output_cost_per_token"
        )
        _append(spend_path(root, agent), {"event": "budget_stop", "reason": "unknown_price",
                                          "budget_usd": config.budget_usd, "time": time.time()})
        raise LLMBudgetError(message, **kw)
    total = spent(root, agent)
    if total >= config.budget_usd:
        _append(spend_path(root, agent), {"event": "budget_stop", "reason": "spent",
                                          "spent_usd": round(total, 6),
                                          "budget_usd": config.budget_usd, "time": time.time()})
        raise LLMBudgetError(
            f"agent {agent!r}: spend cap reached (${total:.4f} of budget_usd "
            f"${config.budget_usd:.4f}); no new calls are made. Raise budget_usd and rerun: "
            f"paid calls are cached and not paid again",
            **kw,
        )


def spend_summary(root: Path) -> list[dict[str, Any]]:
    """One row per agent with a spend ledger in this store, for the report: calls paid, USD
    spent (known prices), calls of unknown price, and whether the cap stopped it."""
    rows = []
    folder = Path(root) / "llm" / "spend"
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        lines = _lines(path)
        calls = [line for line in lines if line.get("event") == "call"]
        stops = [line for line in lines if line.get("event") == "budget_stop"]
        unknown = sum(1 for line in calls if line.get("cost_usd") is None)
        rows.append({
            "agent": path.stem,
            "calls": len(calls),
            "spent_usd": round(sum(float(c.get("cost_usd") or 0.0) for c in calls), 6),
            "unknown_cost_calls": unknown,
            "stopped_by_budget": bool(stops),
            "budget_usd": stops[-1].get("budget_usd") if stops else None,
            "line": _line(path.stem, calls, unknown, stops),
        })
    return rows


def _line(agent: str, calls: list[dict[str, Any]], unknown: int, stops: list[dict[str, Any]]) -> str:
    total = sum(float(c.get("cost_usd") or 0.0) for c in calls)
    text = f"{agent}: {len(calls)} paid calls, ${total:.4f}"
    if unknown:
        text += f" + {unknown} calls of unknown price"
    if stops:
        last = stops[-1]
        why = "price unknown" if last.get("reason") == "unknown_price" else "cap reached"
        text += f"; stopped by budget_usd ${last.get('budget_usd')} ({why})"
    return text
