"""Parent-side judgement of one candidate run against the reference run (numpy only).

Per case, in this order (the first failure is the verdict)::

    candidate raised ─> shape case only? shape_specialized : crashed
    harness replaced (tampering) ─> global state changed ─> precision flags (strict) ─> wrong
    device ─> inputs mutated
    ─> outputs alias inputs ─> work after return ─> structure / shape / dtype
    ─> non-finite where the reference is finite ─> |c - r| <= atol + rtol |r| (NaN fails)
    ─> ||c - r|| / ||r|| <= tol ─> equal to its previous output while the reference moved?
       caches_outputs : (shape case? shape_specialized : output_mismatch)

and once per run: our kernel launched, no reference compute op in the candidate's aten ops;
then the repeat phase (``judge_repeats``): the same instance called again on refilled buffers,
and a fresh one, must still give the reference's answers (else ``stale_output``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kforge.verifier.comparison import Comparison, atol_scale, verdict_of
from kforge.verifier.probes import is_heavy, is_plumbing, precision_violations
from kforge.verifier.protocol import WIRE_DTYPES, Frame
from kforge.verifier.reasons import Reason


@dataclass
class Judgement:
    reason: Reason
    detail: str = ""
    max_abs_err: float | None = None
    rel_err_norm: float | None = None
    cases: int = 0
    margins: list[dict[str, Any]] = field(default_factory=list)  # per case judged on values (schema.CaseMargin)
    notes: list[str] = field(default_factory=list)


def arrays(frame: Frame, key: str = "outputs") -> list[np.ndarray]:
    """The frame's tensors: its ``outputs``, or (``key="exact"``) the reference's float64
    outputs of a stress case, sent after them."""
    metas = frame.header.get(key, [])
    blobs = frame.blobs if key == "outputs" else frame.blobs[len(frame.header.get("outputs", [])):]
    out = []
    for meta, blob in zip(metas, blobs, strict=False):
        arr = np.frombuffer(blob, dtype=WIRE_DTYPES[meta["wire"]])
        shape = list(meta["shape"]) + ([2] if "complex" in meta["dtype"] else [])
        out.append(arr.reshape(shape).astype(np.float64))
    return out


# A whole model the reference's own fp32 arithmetic cannot answer to the tolerance on these
# inputs (training-mode BatchNorm over few values per channel: ResNet101 at the `ci` sizes is
# 0.6% off its float64 answer, ResNet18 at 14 x 14 was 5% off, torch.compile as far): a stitched
# forward no more than this many times as far from the float64 answer as the reference is, in
# the margin and in the error norm, is as right as PyTorch's own kernels are (rule
# ``as_reference``; whole models only, where the reference run sends float64 answers for every
# case: ``verify_candidate(whole_model=True)``). Two fp32 orders of such a model land at random
# distances from the exact answer (measured 0.3x-3.5x of each other over the four cases); a
# stitching error (a wrong weight, a wrong wire) is off by the output's own size.
REFERENCE_ERROR_FACTOR = 4.0


def against_exact(results: list[Comparison], c_out: list[np.ndarray], r_out: list[np.ndarray],
                  exact: list[np.ndarray], tol: float, dist: str, as_reference: bool = False) -> list[Comparison]:
    """A case's output that misses the fp32 reference but is within ``tol`` of the float64 one
    is right (rule ``exact``): the fp32 reference was the one off. ``as_reference``: where the
    fp32 reference itself misses the float64 answer by more than ``tol``, an output within
    ``REFERENCE_ERROR_FACTOR`` times its errors is right too (rule ``as_reference``)."""
    if len(exact) != len(results) or len(r_out) != len(results):
        return results
    out = []
    for res, c, r, e in zip(results, c_out, r_out, exact, strict=True):
        if res.kind == "mismatch" and c.shape == e.shape:
            alt = measure(c, e, tol, dist)
            if alt.kind is None:
                alt.rule = "exact"
                res = alt
            elif as_reference:
                own = measure(r, e, tol, dist)
                if own.kind == "mismatch" and own.margin is not None and alt.margin is not None:
                    allowed = REFERENCE_ERROR_FACTOR * own.margin
                    if alt.margin <= allowed and alt.rel_err_norm <= REFERENCE_ERROR_FACTOR * own.rel_err_norm:
                        res = Comparison(None, alt.max_abs_err, alt.rel_err_norm, alt.margin / allowed, "as_reference")
        out.append(res)
    return out


def measure(c: np.ndarray, r: np.ndarray, tol: float, dist: str = "native", scale: float = 1.0) -> Comparison:
    """:func:`compare` with the margin: on the problem's own inputs (``native``, the other-sizes
    case) max(max_i |c_i - r_i| / (scale atol + rtol |r_i|), rel_err_norm / tol); on the stress
    distributions rel_err_norm / tol. A kernel that passes with a margin of 0.9 passed by a hair.
    ``scale``: a repeated call's (``comparison.atol_scale``)."""
    r_fin = np.isfinite(r)
    if not np.all(np.isfinite(c)[r_fin]):
        return Comparison("nonfinite", float("nan"), float("nan"), None, "elementwise")
    if not np.array_equal(c[~r_fin], r[~r_fin], equal_nan=True):
        return Comparison("mismatch", float("nan"), float("nan"), None, "elementwise")
    diff = np.abs(c[r_fin] - r[r_fin])
    max_abs = float(diff.max()) if diff.size else 0.0
    elementwise = dist in ("native", "")
    ref_norm = float(np.linalg.norm(r[r_fin]))
    err_norm = float(np.linalg.norm(diff))
    rel = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else float("inf"))
    ratio = float((diff / (tol * scale + tol * np.abs(r[r_fin]))).max()) if elementwise and diff.size else 0.0
    return verdict_of(max_abs, rel, ratio, tol, elementwise)


def compare(c: np.ndarray, r: np.ndarray, tol: float, dist: str = "native") -> tuple[str | None, float, float]:
    """(failure kind or None, max abs error, relative error norm); NaN never passes.

    On the problem's own inputs (``native``, and the other-sizes case) every element must be
    within ``atol + rtol |r|``, as KernelBench asks. The stress distributions (signed,
    heavy-tailed, scaled) push the fp32 *reference* itself off the exact result where terms
    cancel (measured on the H200: 4e-4 at K = 8192 with signed operands, outside the strict
    band, for every fp32 summation order), so there only the relative error norm is held to
    ``tol``; every case needs it, so a wrong answer fails either way.
    """
    return measure(c, r, tol, dist).as_tuple()


def _rms(a: np.ndarray) -> float:
    fin = a[np.isfinite(a)]
    return float(np.sqrt(np.mean(fin * fin))) if fin.size else 0.0


INPUTS_DIFFERED = "inputs differed from the reference's before the call"


def judge(
    ref: dict[int, Frame], cand: dict[int, Frame], *, tol: float, strict: bool,
    shape_index: int | None, platform: str,
    on_device: dict[tuple[str, int], list[Comparison]] | None = None, launch_checks: bool = True,
) -> Judgement:
    """The first failure, in the module docstring's order, or OK; every case judged on values
    leaves its margin in ``Judgement.margins`` (the worst output's). ``on_device``: the
    outputs were compared on the GPU by the trusted judge (``gpu_compare.py``), keyed by
    ("case", index); the frames carry no bytes then. ``launch_checks=False`` (a stitched whole
    model, kforge.models: its regions without a kernel of their own run the reference's ops by
    design) leaves out "a kernel of its own ran" and "no reference compute op"."""
    worst_abs, worst_rel = 0.0, 0.0
    margins: list[dict[str, Any]] = []
    prev: dict[str, Any] | None = None
    judged = 0
    for index in sorted(ref):
        r_frame = ref[index]
        if "error" in r_frame.header:
            continue  # this distribution or shape is outside the problem's domain
        c_frame = cand.get(index)
        is_shape = index == shape_index
        if c_frame is None:
            return Judgement(Reason.CRASHED, f"case {index}: the worker stopped before this case")
        h = c_frame.header
        if "error" in h:
            reason = Reason.SHAPE_SPECIALIZED if is_shape else Reason.CRASHED
            return Judgement(reason, f"case {index}{' (other sizes)' if is_shape else ''}: {h['error']}")
        if h.get("tampered"):
            return Judgement(Reason.HARNESS_TAMPERING, "replaced " + ", ".join(h["tampered"][:6]))
        if h.get("global_state"):
            return Judgement(Reason.GLOBAL_STATE_TAMPERING, "changed global state: " + "; ".join(h["global_state"][:6]))
        bad_precision = precision_violations(h["flags"], h.get("flags_before", {}))
        if strict and bad_precision:
            return Judgement(Reason.PRECISION_BELOW_POLICY, "; ".join(bad_precision) + " under strict")
        if h["wrong_device"]:
            return Judgement(Reason.WRONG_DEVICE, "; ".join(h["wrong_device"]))
        if h["digest_after"] != h["digest"]:
            return Judgement(Reason.MUTATES_INPUT, f"case {index}: inputs changed during the call")
        if h["digest"] != r_frame.header["digest"]:  # the candidate's import touched RNG or inputs
            mine, theirs = h.get("input_digests") or [], r_frame.header.get("input_digests") or []
            which = [str(k) for k, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b] if len(mine) == len(theirs) else []
            return Judgement(Reason.MUTATES_INPUT, f"case {index}: {INPUTS_DIFFERED} "
                             f"({'input(s) ' + ', '.join(which) if which else 'the input list'}, "
                             f"dist {r_frame.header.get('dist', '?')}; something the candidate ran changed how they were made)")
        if h["aliases"]:
            return Judgement(Reason.ALIASES_INPUT, f"output(s) {h['aliases']} share memory with an input")
        if h["background"] or h["changed_after_return"]:
            what = ", ".join(h["background"][:4]) or "the output changed after forward returned"
            return Judgement(Reason.ASYNC_WORK_LEFT, f"work still running after return: {what}")
        n_out = len(h["outputs"])
        if n_out != len(r_frame.header["outputs"]):
            return Judgement(Reason.SHAPE_MISMATCH, f"{n_out} outputs, expected {len(r_frame.header['outputs'])}")
        for k, (cm, rm) in enumerate(zip(h["outputs"], r_frame.header["outputs"], strict=True)):
            if cm["shape"] != rm["shape"]:
                reason = Reason.SHAPE_SPECIALIZED if is_shape else Reason.SHAPE_MISMATCH
                return Judgement(reason, f"output {k}: shape {cm['shape']}, expected {rm['shape']}")
            if cm["dtype"] != rm["dtype"]:
                return Judgement(Reason.DTYPE_MISMATCH, f"output {k}: {cm['dtype']}, expected {rm['dtype']}")
        dist = "native" if is_shape else str(r_frame.header.get("dist", "native"))
        if on_device is not None:  # compared on the GPU by the trusted judge (gpu_compare.py)
            results = on_device.get(("case", index))
            if results is None or len(results) != n_out:
                return Judgement(Reason.CRASHED, f"case {index}: the comparison on the device got no answer "
                                 "for these outputs (the candidate's process let go of them too early?)")
            mine: Any = [c.fingerprint for c in results]
        else:
            c_out, r_out = arrays(c_frame), arrays(r_frame)
            results = [measure(c, r, tol, dist) for c, r in zip(c_out, r_out, strict=True)]
            if r_frame.header.get("exact"):
                results = against_exact(results, c_out, r_out, arrays(r_frame, "exact"), tol, dist,
                                        as_reference=bool(r_frame.header.get("as_reference")))
            mine = c_out
        worst = max(range(n_out), key=lambda k: _rank(results[k]), default=None)
        if worst is not None:
            res = results[worst]
            margins.append({"case": index, "dist": dist, "other_sizes": is_shape, "output": worst,
                            "margin": _finite(res.margin), "rule": res.rule,
                            "max_abs_err": _finite(res.max_abs_err), "rel_err_norm": _finite(res.rel_err_norm)})
        for k, res in enumerate(results):
            if res.kind is None:
                worst_abs, worst_rel = max(worst_abs, res.max_abs_err), max(worst_rel, res.rel_err_norm)
                continue
            margin = "" if res.margin is None else f", margin {res.margin:.3g}x the allowed error"
            detail = (f"case {index} ({r_frame.header.get('dist', '')}) output {k}: max abs err {res.max_abs_err:.3g}, "
                      f"rel err norm {res.rel_err_norm:.3g} (tol {tol:g}{margin})")
            if res.kind == "nonfinite":
                return Judgement(Reason.NONFINITE, f"case {index} output {k}: NaN/inf where the reference is finite",
                                 margins=margins)
            if prev is not None and _same_as_previous(mine, prev, on_device is not None):
                return Judgement(Reason.CACHES_OUTPUTS, f"case {index}: returned its previous output for new inputs",
                                 margins=margins)
            reason = Reason.SHAPE_SPECIALIZED if is_shape else Reason.OUTPUT_MISMATCH
            return Judgement(reason, detail, res.max_abs_err, res.rel_err_norm, margins=margins)
        prev = {"outputs": mine}
        judged += 1
    first = cand.get(0)
    if launch_checks and first is not None and "error" not in first.header:
        verdict = _launch_checks(first.header, ref[0].header, platform)
        if verdict is not None:
            verdict.margins = margins
            return verdict
    return Judgement(Reason.OK, f"{judged} cases passed", worst_abs, worst_rel, judged, margins=margins)


def _rank(res: Comparison) -> float:
    """Worst first: a non-finite output, then the largest margin."""
    return float("inf") if res.margin is None or res.margin != res.margin else res.margin


def _finite(value: float | None) -> float | None:
    """JSON-safe: NaN and inf become None (not measurable)."""
    return value if value is not None and math.isfinite(value) else None


def max_margin(margins: list[dict[str, Any]]) -> float | None:
    """The worst case's margin; None when there is none or one was not measurable."""
    values = [m.get("margin") for m in margins]
    if not values or any(v is None for v in values):
        return None
    return max(float(v) for v in values)  # type: ignore[arg-type]


def _same_as_previous(c_out: list[Any], prev: dict[str, Any], fingerprints: bool = False) -> bool:
    old = prev["outputs"]
    if fingerprints:  # the IPC path: outputs never left the device; equal fingerprints
        return len(old) == len(c_out) and all(a and a == b for a, b in zip(c_out, old, strict=True))
    return len(old) == len(c_out) and all(
        a.shape == b.shape and np.array_equal(a, b, equal_nan=True) for a, b in zip(c_out, old, strict=True)
    )


def _launch_checks(h: dict[str, Any], ref_h: dict[str, Any], platform: str) -> Judgement | None:
    ref_ops = {o for o in ref_h.get("ops", []) if not is_plumbing(o)}
    cand_ops = set(h.get("ops", []))
    heavy_used = sorted(o for o in cand_ops & ref_ops if is_heavy(o))
    if heavy_used:
        return Judgement(Reason.CALLS_REFERENCE_OP, "ran the reference's compute in PyTorch: " + ", ".join(heavy_used[:5]))
    if ref_ops and ref_ops <= cand_ops:
        return Judgement(Reason.CALLS_REFERENCE_OP, "ran every aten op the reference runs: " + ", ".join(sorted(ref_ops)[:6]))
    launched = bool(h.get("ours")) or h.get("triton_launches", 0) > 0 or bool(h.get("device_kernels"))
    if not launched:
        where = {"cpu": "no kforge:: kernel region (cpu_runtime.launch)", "triton": "no Triton JIT launch"}
        return Judgement(Reason.NO_KERNEL_LAUNCHED, f"{where.get(platform, 'no kernel of its own')} ran during forward")
    return None


def judge_repeats(ref: dict[int, Frame], ref_repeats: list[Frame], repeats: list[Frame], tol: float,
                  on_device: dict[tuple[str, int], list[Comparison]] | None = None) -> Judgement | None:
    """The repeat phase's answers (``repeats.py``) against the reference's answers for the same
    calls' inputs; None when they agree (or there is nothing to hold them to). Every call the
    plan emits must have answered: a phase that went quiet (skipped, or its harness silenced
    from inside) is ``stale_output`` too. ``on_device``: compared on the GPU by the trusted
    judge, keyed by ("repeat", rep)."""
    first = ref.get(0)
    if first is None or not first.header.get("deterministic", True):
        return None  # a nondeterministic reference: repeated answers cannot be held to it
    if not ref_repeats or any("error" in f.header for f in ref_repeats):
        return None  # the reference itself could not answer for the repeat phase's inputs
    mine: dict[int, Frame] = {}
    for frame in repeats:
        h = frame.header
        if "error" in h:
            return Judgement(Reason.STALE_OUTPUT, f"a repeated call raised: {h['error']}")
        mine[int(h["rep"])] = frame
    missing = sorted(int(f.header["rep"]) for f in ref_repeats if int(f.header["rep"]) not in mine)
    if missing:
        return Judgement(Reason.STALE_OUTPUT, (
            f"the repeat phase's answers for calls {missing[:6]} never arrived: the phase did not run as "
            "the harness runs it"))
    for r_frame in ref_repeats:
        rep = int(r_frame.header["rep"])
        frame, h = mine[rep], mine[rep].header
        case = ref.get(int(r_frame.header["case"]))
        dist = str(case.header.get("dist", "native")) if case is not None else "native"
        who = ("a fresh ModelNew" if rep < 0 else
               f"call {rep + 1} of the repeat phase (same instance, input buffer set {h['slot']})")
        c_meta, r_meta = h.get("outputs", []), r_frame.header["outputs"]
        if len(c_meta) != len(r_meta) or any(c["shape"] != r["shape"] for c, r in zip(c_meta, r_meta, strict=False)):
            return Judgement(Reason.STALE_OUTPUT, f"{who}: outputs of other shapes than case {h['case']}'s")
        if on_device is not None:
            results = on_device.get(("repeat", rep))
            if results is None or len(results) != len(r_meta):
                return Judgement(Reason.CRASHED, f"{who}: the comparison on the device got no answer")
        else:
            bases = arrays(case) if case is not None else []
            results = []
            for k, (c, r) in enumerate(zip(arrays(frame), arrays(r_frame), strict=True)):
                scale = atol_scale(_rms(r), _rms(bases[k])) if k < len(bases) else 1.0
                results.append(measure(c, r, tol, dist, scale))
            if r_frame.header.get("exact"):  # a bf16 / f16 answer (worker.low_precision)
                results = against_exact(results, arrays(frame), arrays(r_frame), arrays(r_frame, "exact"), tol, dist,
                                        as_reference=bool(r_frame.header.get("as_reference")))
        for k, res in enumerate(results):
            if res.kind is not None:
                return Judgement(Reason.STALE_OUTPUT, (
                    f"{who} on changed inputs of case {h['case']}: output {k} max abs err {res.max_abs_err:.3g}, "
                    f"rel err norm {res.rel_err_norm:.3g}; the cases were right: the answer depends on what "
                    "ran before or on a few sampled inputs"), res.max_abs_err, res.rel_err_norm)
    return None
