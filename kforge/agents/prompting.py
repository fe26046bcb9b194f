"""Prompts as files under version control: ``kforge/prompts/*.md`` rendered into chat messages.

The digests of these files are part of every agent call's cache key, and of the Snakemake
``params`` of the stages that use them, so editing a prompt reruns exactly the stages it feeds.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from kforge.schema import TOLERANCES, AnalysisRequest, Feedback, GenerationRequest, Profile

# KFORGE_PROMPTS_DIR points at another copy of the prompt files (a prompt experiment, a test).
PROMPTS_DIR = Path(
    os.environ.get("KFORGE_PROMPTS_DIR") or Path(__file__).resolve().parents[1] / "prompts"
)
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


# --------------------------------------------------------------------------- scrubbing
# Error text shown to a model keeps the candidate's own file names and lines, and loses
# absolute paths and quoted source lines of every other file (the host's layout and other
# files' contents are none of the model's business; see docs/VERIFY.md, "Sandbox").

CANDIDATE_STEMS = ("candidate", "kernel", "solution")  # what platforms name candidate files
_PATH = re.compile(r"(?<![\w.~<>:/-])/(?:[\w.+@~-]+/)*[\w.+@~-]+")
_PY_FRAME = re.compile(r'^(\s*File ")(/[^"]+)(", line \d+.*)$')
_DIAG = re.compile(r"^(?:In file included from )?(/[^:\s]+)(:\d+(?::\d+)?[:,].*)$")
_EXCERPT = re.compile(r"^\s*(\d+\s*)?\|")  # gcc/clang/nvcc ``  12 |  code`` and ``   |  ^~``
_CARET = re.compile(r"^\s*[~^]+[~^ ]*$")


def is_candidate_path(path: str) -> bool:
    stem = path.rsplit("/", 1)[-1].split(".", 1)[0]
    return stem.startswith(CANDIDATE_STEMS)


def _short_path(path: str) -> str:
    if is_candidate_path(path):
        return path.rsplit("/", 1)[-1]
    tail = "/".join(path.rstrip("/").split("/")[-2:])
    return f"<external>/{tail}"


def scrub_paths(text: str) -> str:
    """Collapse absolute paths (the candidate's to its file name, others to ``<external>/``
    plus two components) and drop the quoted source lines of files outside the candidate."""
    out: list[str] = []
    dropping = False  # inside the source excerpt of an external file
    for line in text.splitlines():
        frame = _PY_FRAME.match(line)
        diag = None if frame else _DIAG.match(line)
        if frame or diag:
            path = (frame or diag).group(2 if frame else 1)  # type: ignore[union-attr]
            external = not is_candidate_path(path)
            line = line.replace(path, _short_path(path), 1)
            out.append(line)
            dropping = external
            continue
        if dropping:
            # A Python frame's code line is indented deeper than its "File" line; compiler
            # excerpts are "N | code" / "| ^~~" lines or a bare source line plus a caret line.
            if (
                _EXCERPT.match(line)
                or _CARET.match(line)
                or (line.startswith("    ") and out and out[-1].lstrip().startswith("File "))
            ):
                continue
            dropping = False
        out.append(_PATH.sub(lambda m: _short_path(m.group(0)), line))
    return "\n".join(out)


def feedback_text(detail: str) -> str:
    """What a model is shown of one feedback item: scrubbed, then truncated."""
    return truncate(scrub_paths(detail))


def _feedback_section(items: list[Feedback]) -> str:
    if not items:
        return ""
    parts = ["\n## What went wrong last round (fix it)\n"]
    for item in items:
        parts.append(f"- {item.stage}: `{item.reason}`\n```\n{feedback_text(item.detail)}\n```\n")
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
        lines = [
            f"\n## Performance analysis of the previous candidate\nBottleneck: {rec.bottleneck}. {rec.summary}\n"
        ]
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
    for label, t in (
        ("candidate", profile.candidate),
        ("eager", profile.eager),
        ("torch.compile", profile.compiled),
    ):
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


def attach_image(
    messages: list[dict[str, Any]], png_b64: str, caption: str
) -> list[dict[str, Any]]:
    """The same messages with the last user message turned into text + ``image_url`` parts
    (the OpenAI multi-part form litellm forwards to vision models)."""
    out: list[dict[str, Any]] = [dict(m) for m in messages]
    for message in reversed(out):
        if message["role"] == "user":
            message["content"] = [
                {"type": "text", "text": message["content"]},
                {"type": "text", "text": caption},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png_b64}"}},
            ]
            return out
    raise ValueError("no user message to attach the image to")
