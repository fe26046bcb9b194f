"""A picture of a profile, for models that read images (what a GUI profiler would show).

Two panels, drawn with matplotlib's Agg backend (imported only here, only when asked):

- *timeline*: one forward call of the candidate, its kernels laid end to end in launch order
  with their time per call, so a long tail of small launches or one dominant kernel shows;
- *against the baselines*: median time of the candidate, eager and torch.compile, with the
  roofline floor drawn as a line.

The PNG is byte-for-byte deterministic for the same profile (no timestamp, no version in the
metadata) because it is part of the LLM request, and so of its cache key.
"""

from __future__ import annotations

import base64
import io

from kforge.schema import Profile

MAX_KERNELS = 12
_METADATA = {"Software": None}


def _short(name: str, limit: int = 28) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "~"


def _per_call_segments(profile: Profile) -> list[tuple[str, float]]:
    """(kernel, microseconds per forward call) in launch order, the rest folded together."""
    if not profile.kernels:
        return []
    calls = max(1, min(k.calls for k in profile.kernels))  # forward calls the profile spans
    segments = [(k.name, k.total_us / calls) for k in profile.kernels]
    if len(segments) > MAX_KERNELS:
        head = segments[: MAX_KERNELS - 1]
        rest = sum(us for _, us in segments[MAX_KERNELS - 1 :])
        segments = [*head, (f"{len(segments) - len(head)} others", rest)]
    return segments


def render_timeline_png(profile: Profile) -> bytes:
    """The two-panel picture of ``profile`` as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=80)
    top, bottom = fig.subplots(2, 1, gridspec_kw={"height_ratios": [1, 1.2]})

    segments = _per_call_segments(profile)
    start = 0.0
    colors = [f"C{i % 10}" for i in range(len(segments))]
    total = sum(us for _, us in segments) or 1.0
    for (name, us), color in zip(segments, colors, strict=True):
        top.barh(0, us, left=start, color=color, edgecolor="black", linewidth=0.5)
        if us > 0:
            wide = us / total > 0.2
            label = _short(name, 28 if wide else 16)
            top.text(
                start + us / 2,
                0,
                label,
                ha="center",
                va="center",
                fontsize=7,
                rotation=0 if wide else 90,
            )
        start += us
    top.set_yticks([])
    top.set_xlabel("microseconds per forward call (kernels in launch order)")
    top.set_title(
        f"candidate timeline on {profile.device}" if segments else "no kernel table in this profile"
    )
    if segments:
        top.set_xlim(0, max(start, 1e-3) * 1.02)

    labels: list[str] = []
    values: list[float] = []
    for label, timing in (
        ("candidate", profile.candidate),
        ("eager", profile.eager),
        ("torch.compile", profile.compiled),
    ):
        if timing is not None:
            labels.append(label)
            values.append(timing.median_ms)
    if values:
        bars = bottom.barh(labels, values, color=["C3", "C0", "C2"][: len(values)])
        for bar, value in zip(bars, values, strict=True):
            bottom.text(
                bar.get_width(),
                bar.get_y() + bar.get_height() / 2,
                f" {value:.4f} ms",
                va="center",
                fontsize=7,
            )
        bottom.set_xlim(0, max(values) * 1.3)
    if profile.roofline_ms > 0:
        bottom.axvline(profile.roofline_ms, color="black", linestyle="--", linewidth=1)
        bottom.text(profile.roofline_ms, -0.6, " roofline", fontsize=7, va="center")
    bottom.set_xlabel("median ms per call")
    bottom.set_title(
        f"{profile.achieved_gflops:.1f} GFLOP/s of {profile.peak_gflops:.1f}, "
        f"{profile.achieved_gbps:.1f} GB/s of {profile.peak_gbps:.1f}",
        fontsize=9,
    )
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata=_METADATA)
    return buffer.getvalue()


def timeline_png_b64(profile: Profile) -> str:
    """Base64 of :func:`render_timeline_png`, the form ``AnalysisRequest.timeline_png`` holds."""
    return base64.b64encode(render_timeline_png(profile)).decode()
