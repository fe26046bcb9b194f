"""One output against the reference: the record both judges write (no numpy here: the
on-device judge runs inside the candidate's sandbox, whose view may hold none)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Comparison:
    """One output against the reference: the failure kind (None: passed), the errors, and the
    margin: the worst error over what the rule allowed (<= 1 passes; see :func:`compare`)."""

    kind: str | None
    max_abs_err: float
    rel_err_norm: float
    margin: float | None  # None: not measurable (non-finite where the reference is finite)
    rule: str  # "elementwise" or "norm": which limit the margin is closest to
    fingerprint: list[float] = field(default_factory=list)  # IPC path only: equality hint

    def as_tuple(self) -> tuple[str | None, float, float]:
        return self.kind, self.max_abs_err, self.rel_err_norm


def verdict_of(max_abs: float, rel: float, ratio: float, tol: float, elementwise: bool) -> Comparison:
    """The verdict and margin from the three errors; shared by the parent's numpy path
    (``correctness.measure``) and the on-device judge (``gpu_compare.compare_on_device``)."""
    norm_margin = rel / tol
    margin, rule = (ratio, "elementwise") if elementwise and ratio >= norm_margin else (norm_margin, "norm")
    ok = (not elementwise or ratio <= 1.0) and rel <= tol  # NaN in either -> False
    return Comparison(None if ok else "mismatch", max_abs, rel, margin, rule)


def atol_scale(rep_rms: float, case_rms: float) -> float:
    """How much a repeated call's absolute tolerance grows: the repeat phase's contents scale
    the inputs by powers of two (``content.py``), exact in floating point, so a kernel's
    rounding error scales with its output; ``atol + rtol |r|`` would hold a scaled-up output's
    near-zero elements to the unscaled band (an honest fp32 GEMV at K = 2048, both operands
    doubled, missed it by 3e-4 where its cases passed). The band's absolute part follows the
    output's RMS against its case's (never below 1); a stale answer is off by the output's own
    size, which no such band admits."""
    if not (case_rms > 0.0 and rep_rms > case_rms) or rep_rms == float("inf"):
        return 1.0
    return rep_rms / case_rms
