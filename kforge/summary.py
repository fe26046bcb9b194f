"""Suite metrics over report rows, one summary row per (agent, platform, suite, policy).

Every problem of the suite counts, whatever happened to it:

- ``geomean_all``: geometric mean of ``shipped_speedup`` over ALL problems. A row that did not
  ship (failed, no gain, flagged, untimed) contributes 1.0: its answer is the PyTorch reference.
- ``geomean_shipped_only``: the same over shipped rows only (None when nothing shipped); it says
  how good the shipped kernels are, not how good the suite run was.
- ``fast_p`` (KernelBench's definition): the fraction of ALL problems whose kernel is correct
  (``verified``: passed the verifier and trusted) AND whose measured speedup over the faster of
  eager and torch.compile is greater than p. ``fast_0`` is the fraction correct. A correct row
  that was never timed (``verified_interpreted``) counts for ``fast_0`` only. ``fast_1`` can
  exceed ``shipped / problems``: a kernel 1% faster inside the noise band is fast_1 but not shipped.
- ``worst_margin``: the largest ``max_margin`` (max error / allowed error over the verification
  cases) among the verified rows; ``near_tolerance``: how many verified rows used at least
  ``NEAR_TOLERANCE`` of their allowed error (they pass, but by a hair).
- tokens, cost and wall time are sums over the group's cells (wall time: the stages' own seconds,
  not the pipeline's elapsed time, which overlaps cells); ``cost_per_shipped_usd`` is the total
  cost divided by the shipped count (None when nothing shipped).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

FAST_P = (0.0, 1.0, 1.5, 2.0, 5.0)
GROUP = ("agent", "platform", "suite", "policy")
NEAR_TOLERANCE = 0.5  # a verified row whose worst error is at least half the allowed one


def fast_p_column(p: float) -> str:
    return "fast_" + (f"{p:g}".replace(".", "_"))


def geomean(values: Iterable[float]) -> float | None:
    logs = [math.log(v) for v in values if v and v > 0]
    return math.exp(sum(logs) / len(logs)) if logs else None


def fast_p(rows: list[dict[str, Any]], p: float) -> float:
    """KernelBench fast_p: fraction of the rows that are correct and faster than p."""
    if not rows:
        return 0.0
    hits = sum(
        1 for r in rows
        if r.get("verified") and (p == 0 or (r.get("speedup_vs_best") or 0.0) > p)
    )
    return hits / len(rows)


def _group_row(key: tuple[Any, ...], rows: list[dict[str, Any]]) -> dict[str, Any]:
    shipped = [r for r in rows if r.get("shipped")]
    cost = sum(r.get("cost_usd") or 0.0 for r in rows)
    prompt = sum(r.get("prompt_tokens") or 0 for r in rows)
    completion = sum(r.get("completion_tokens") or 0 for r in rows)
    row: dict[str, Any] = dict(zip(GROUP, key, strict=True))
    row.update({
        "problems": len(rows),
        "verified": sum(1 for r in rows if r.get("verified")),
        "shipped": len(shipped),
        "no_gain": sum(1 for r in rows if r.get("status") == "no_gain"),
        "geomean_all": round(geomean(r.get("shipped_speedup") or 1.0 for r in rows) or 1.0, 4),
        "geomean_shipped_only": _round(geomean(r["shipped_speedup"] for r in shipped)),
    })
    for p in FAST_P:
        row[fast_p_column(p)] = round(fast_p(rows, p), 4)
    margins = [float(r["max_margin"]) for r in rows if r.get("verified") and r.get("max_margin") is not None]
    row.update({
        "worst_margin": _round(max(margins)) if margins else None,
        "near_tolerance": sum(1 for m in margins if m >= NEAR_TOLERANCE),
        "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
        "cost_usd": round(cost, 6), "cost_per_shipped_usd": round(cost / len(shipped), 6) if shipped else None,
        "wall_s": round(sum(r.get("wall_s") or 0.0 for r in rows), 3),
    })
    return row


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One summary row per (agent, platform, suite, policy), sorted."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in GROUP), []).append(r)
    return [_group_row(k, groups[k]) for k in sorted(groups, key=lambda k: tuple(str(x) for x in k))]


def format_summary(summary: list[dict[str, Any]]) -> str:
    """The summary as readable lines for ``kforge report``."""
    lines = []
    for s in summary:
        fast = "  ".join(f"fast_{p:g}={s[fast_p_column(p)]:.2f}" for p in FAST_P)
        shipped_only = s["geomean_shipped_only"]
        per = s["cost_per_shipped_usd"]
        lines.append(
            f"{s['agent']} / {s['platform']} / {s['suite']} / {s['policy']}: {s['problems']} problems, "
            f"{s['verified']} verified, {s['shipped']} shipped\n"
            f"  geomean speedup over ALL problems (not shipped = 1.0): {s['geomean_all']:.2f}x; "
            f"over shipped only: {'-' if shipped_only is None else f'{shipped_only:.2f}x'}\n"
            f"  {fast}\n"
            f"  error margin (max error / allowed, verified rows): worst "
            f"{'-' if s.get('worst_margin') is None else format(s['worst_margin'], '.3g')}, "
            f"{s.get('near_tolerance', 0)} at >= {NEAR_TOLERANCE:g} of the tolerance\n"
            f"  tokens {s['total_tokens']} (in {s['prompt_tokens']}, out {s['completion_tokens']}), "
            f"cost ${s['cost_usd']:.4f}, per shipped kernel {'-' if per is None else f'${per:.4f}'}, "
            f"stage time {s['wall_s']:.1f} s"
        )
    return "\n".join(lines)
