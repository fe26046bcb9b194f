"""Prompts as files under version control: ``kforge/prompts/*.md`` rendered into chat messages.

The digests of these files are part of every agent call's cache key, and of the Snakemake
``params`` of the stages that use them, so editing a prompt reruns exactly the stages it feeds.
A template's sections (``contract.md``, ``device.md``, ``progress.md``: :data:`INCLUDES`) are
part of its digest.

What an LLM agent is told (``GenerationRequest.context`` / ``AnalysisRequest.context``, built
by ``kforge.stages.agent_calls.agent_context``): the device sheet (measured peaks and the
device's properties), the contract (timed sizes, tolerance, the verifier's reason codes), and
in later rounds the candidate's timings against eager and torch.compile and the ledger of
every earlier round. The analyst also sees the reference ``Model``.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from kforge.schema import (
    TOLERANCES,
    AgentContext,
    AnalysisRequest,
    Feedback,
    GenerationRequest,
    Policy,
    Profile,
)

# KFORGE_PROMPTS_DIR points at another copy of the prompt files (a prompt experiment, a test).
PROMPTS_DIR = Path(
    os.environ.get("KFORGE_PROMPTS_DIR") or Path(__file__).resolve().parents[1] / "prompts"
)
FEEDBACK_CHARS = 4000  # per feedback item shown to the model


def prompt_text(name: str) -> str:
    return (PROMPTS_DIR / f"{name}.md").read_text()


# The section files each template is rendered with: part of the template's digest.
INCLUDES: dict[str, tuple[str, ...]] = {
    "generate": ("contract", "device", "progress"),
    "analyze": ("contract", "device", "progress"),
}


def prompt_digest(*names: str) -> str:
    """sha256 over the named prompt files and the sections they include (a cache-key part
    and a Snakemake param)."""
    h = hashlib.sha256()
    for name in names:
        for part in (name, *INCLUDES.get(name, ())):
            h.update(part.encode())
            h.update(prompt_text(part).encode())
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
# files' contents are none of the model's business; see docs/VERIFY_DESIGN.md, "The processes, and what each may see").

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


# --------------------------------------------------------------------------- context

# Device facts worth a model's attention, in order, with their units; noise (clocks, host
# name, when it was measured, sandbox mode) stays out.
DEVICE_FACTS = (
    ("device_name", "device", ""),
    ("compute_capability", "compute capability", ""),
    ("sms", "SMs", ""),
    ("shared_memory_per_sm_kib", "shared memory per SM", " KiB"),
    ("shared_memory_per_block_kib", "shared memory per block (opt-in max)", " KiB"),
    ("registers_per_sm", "32-bit registers per SM", ""),
    ("l2_cache_mib", "L2 cache", " MiB"),
    ("memory_gib", "device memory", " GiB"),
    ("cores", "CPU cores available", ""),
    ("isa", "vector ISA", ""),
    ("l2_cache_kib", "L2 cache per core", " KiB"),
    ("l3_cache_mib", "last-level cache", " MiB"),
    ("copy_gbps", "measured copy bandwidth (DRAM-sized buffers)", " GB/s"),
    ("read_gbps", "measured streaming read bandwidth", " GB/s"),
    ("cache_copy_gbps", "measured copy bandwidth (cache-resident buffers)", " GB/s"),
    ("rated_gbps", "rated DRAM bandwidth", " GB/s"),
    ("matmul_gflops", "measured fp32 matmul", " GFLOP/s"),
    ("tf32_gflops", "measured TF32 tensor-core matmul", " GFLOP/s"),
    ("bf16_gflops", "measured bf16 tensor-core matmul", " GFLOP/s"),
    ("policy_matmul_gflops", "matmul ceiling this policy allows", " GFLOP/s"),
)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}" if value >= 100 else f"{value:.4g}"
    return str(value)


def device_section(context: AgentContext | None) -> str:
    if context is None or not context.device:
        return ""
    lines = [
        f"- {label}: {_fmt(context.device[key])}{unit}"
        for key, label, unit in DEVICE_FACTS
        if context.device.get(key) not in (None, "", 0, 0.0)
    ]
    return "\n" + prompt_text("device").format(device_sheet="\n".join(lines))


def contract_section(context: AgentContext | None, policy: Policy) -> str:
    if context is None:
        return ""
    sizes = ", ".join(f"{k} = {v}" for k, v in sorted(context.timed_sizes.items())) or "as written"
    return "\n" + prompt_text("contract").format(
        preset=context.preset or "suite", timed_sizes=sizes, policy=policy,
        tolerance=TOLERANCES[policy],
    )


def progress_section(context: AgentContext | None, *, signals: bool = True) -> str:
    """Timings, profiler signals (the analyst has them in its profile already: ``signals=
    False``), the attempt ledger and the best kernel so far."""
    if context is None or not context.ledger:
        return ""
    t = context.timings
    parts = []
    if "candidate_ms" in t:
        parts.append(f"- the previous candidate: {t['candidate_ms']:.4g} ms")
    for key, label in (("eager_ms", "PyTorch eager"), ("compile_ms", "torch.compile")):
        if key in t:
            ratio = f" (candidate speedup {t[key] / t['candidate_ms']:.2f}x)" if t.get("candidate_ms") else ""
            parts.append(f"- {label}: {t[key]:.4g} ms{ratio}")
    if "roofline_ms" in t:
        frac = f"; the candidate runs at {t['roofline_fraction']:.1%} of that speed" if "roofline_fraction" in t else ""
        parts.append(f"- roofline floor: {t['roofline_ms']:.4g} ms{frac}")
    for key, value in context.signals.items() if signals else ():
        parts.append(f"- {key}: {value}")
    if "max_abs_err" in t:
        margin = f"; it used {t['max_margin']:.3g} of the allowed error" if "max_margin" in t else ""
        parts.append(f"- its largest error: {t['max_abs_err']:.3g} (tolerance {t.get('tolerance', 0):.0e}{margin})")
    rows = [
        f"| {a.round}{' (best)' if a.best else ''} | {a.mode} | {a.tried or '-'} | {a.verdict or '-'} "
        f"| {'-' if a.candidate_ms is None else f'{a.candidate_ms:.4g}'} |"
        for a in context.ledger
    ]
    best = ""
    if context.best_source:
        best = (
            "\nThe fastest verified kernel so far is not the previous candidate; here it is:\n"
            f"```python\n{context.best_source}\n```\n"
        )
    return "\n" + prompt_text("progress").format(
        timings="\n".join(parts) or "- not timed yet", ledger="\n".join(rows), best=best
    )


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
        contract=contract_section(req.context, req.policy),
        device=device_section(req.context),
        progress=progress_section(req.context),
    )
    return [
        {"role": "system", "content": prompt_text("system")},
        {"role": "user", "content": user},
    ]


# Profile extras that describe how it was measured, not the kernel: kept out of prompts.
PROFILE_NOISE = frozenset({
    "checked", "clock", "clock_telemetry", "clocks", "parent_clock", "pin", "sandbox", "seconds",
    "why", "host", "measured_at",
})


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
        if key not in PROFILE_NOISE:
            lines.append(f"{key}: {value}")
    return "\n".join(lines)


def render_analysis_messages(req: AnalysisRequest) -> list[dict[str, str]]:
    reference = ""
    if req.problem_source:
        reference = f"\n## Reference (`Model`)\n```python\n{req.problem_source}\n```\n"
    user = prompt_text("analyze").format(
        platform=req.platform,
        policy=req.policy,
        candidate_source=req.candidate_source,
        profile_summary=profile_summary(req.profile),
        reference=reference,
        contract=contract_section(req.context, req.policy),
        device=device_section(req.context),
        progress=progress_section(req.context, signals=False),
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
