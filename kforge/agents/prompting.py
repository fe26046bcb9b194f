"""Prompts as files under version control: ``kforge/prompts/*.md`` rendered into chat messages.

The digests of these files are part of every agent call's cache key, and of the Snakemake
``params`` of the stages that use them, so editing a prompt reruns exactly the stages it feeds.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from kforge.schema import TOLERANCES, AnalysisRequest, Feedback, GenerationRequest, Profile

# KFORGE_PROMPTS_DIR points at another copy of the prompt files (a prompt experiment, a test).
PROMPTS_DIR = Path(os.environ.get("KFORGE_PROMPTS_DIR") or Path(__file__).resolve().parents[1] / "prompts")
FEEDBACK_CHARS = 4000  # per feedback item shown to the model


def prompt_text(name: str) -> str:
    return (PROMPTS_DIR / f"{name}.md").read_text()


def prompt_digest(*names: str) -> str:
    """sha256 over the named prompt files (a cache-key part and a Snakemake param)."""
    h = hashlib.sha256()
    for name in names:
        h.update(name.encode())
        h.update(prompt_text(name).encode())
    return h.hexdigest()


def truncate(text: str, limit: int = FEEDBACK_CHARS) -> str:
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n... [{len(text) - limit} characters cut] ...\n{text[-tail:]}"


def _feedback_section(items: list[Feedback]) -> str:
    if not items:
        return ""
    parts = ["\n## What went wrong last round (fix it)\n"]
    for item in items:
        parts.append(f"- {item.stage}: `{item.reason}`\n```\n{truncate(item.detail)}\n```\n")
    return "".join(parts)


def render_generation_messages(req: GenerationRequest) -> list[dict[str, str]]:
    transfer = ""
    if req.transfer_source:
        transfer = (
            f"\n## A verified kernel for the same problem on `{req.transfer_platform}`\n"
            f"Port its ideas (fusion, tiling), not its language.\n```python\n{req.transfer_source}\n```\n"
        )
    previous = ""
    if req.previous_source:
        previous = f"\n## Your previous candidate (round {req.round - 1})\n```python\n{req.previous_source}\n```\n"
    recommendation = ""
    if req.recommendation is not None:
        rec = req.recommendation
        lines = [f"\n## Performance analysis of the previous candidate\nBottleneck: {rec.bottleneck}. {rec.summary}\n"]
        for i, action in enumerate(rec.actions, 1):
            lines.append(
                f"{i}. {action.kind} {action.params} (expected x{action.expected_gain:.2f}): {action.rationale}\n"
            )
        recommendation = "".join(lines)
    user = prompt_text("generate").format(
        platform=req.platform,
        policy=req.policy,
        tolerance=TOLERANCES[req.policy],
        problem_source=req.problem_source,
        example_notes=req.example.notes,
        example_problem=req.example.problem_source,
        example_solution=req.example.solution_source,
        transfer=transfer,
        previous=previous,
        feedback=_feedback_section(req.feedback),
        recommendation=recommendation,
    )
    return [
        {"role": "system", "content": prompt_text("system")},
        {"role": "user", "content": user},
    ]


def profile_summary(profile: Profile) -> str:
    """A compact, model-readable summary of a profile."""
    lines = [f"device: {profile.device}"]
    for label, t in (("candidate", profile.candidate), ("eager", profile.eager), ("torch.compile", profile.compiled)):
        if t is not None:
            lines.append(f"{label}: median {t.median_ms:.4f} ms, cv {t.cv:.3f}, reps {t.reps}")
    lines.append(
        f"work: {profile.flops:.3e} FLOP, {profile.min_bytes:.3e} bytes minimum; "
        f"achieved {profile.achieved_gflops:.1f} GFLOP/s of {profile.peak_gflops:.1f} peak, "
        f"{profile.achieved_gbps:.1f} GB/s of {profile.peak_gbps:.1f} peak; roofline floor {profile.roofline_ms:.4f} ms"
    )
    if profile.kernels:
        lines.append("kernels (name, calls, total us):")
        lines.extend(f"  {k.name}: {k.calls}, {k.total_us:.1f}" for k in profile.kernels[:20])
    for key, value in sorted(profile.extra.items()):
        lines.append(f"{key}: {value}")
    return "\n".join(lines)


def render_analysis_messages(req: AnalysisRequest) -> list[dict[str, str]]:
    user = prompt_text("analyze").format(
        platform=req.platform,
        policy=req.policy,
        candidate_source=req.candidate_source,
        profile_summary=profile_summary(req.profile),
    )
    return [
        {"role": "system", "content": prompt_text("system")},
        {"role": "user", "content": user},
    ]
