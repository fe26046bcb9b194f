"""Correctness: the honest path passes; comparisons are NaN-safe and norm-aware."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest
import torch

from kforge.verifier.correctness import compare
from kforge.verifier.inputs import Case, alternative_sizes, make_inputs, plan_cases

from .conftest import FIXTURES, HONEST, verify


def test_honest_candidate_passes_every_case() -> None:
    v = verify(HONEST)
    assert v.ok, v.detail
    assert v.reason == "ok"
    assert v.trials == 5  # 4 distributions + 1 case at other sizes
    assert v.sandbox.startswith("bwrap") or v.sandbox.startswith(("unshare", "setsid"))
    assert v.rel_err_norm is not None and v.rel_err_norm < 1e-4
    # error margins on record: every case judged, its worst output's error / allowed error
    assert [m.case for m in v.margins] == [0, 1, 2, 3, 4] and v.margins[-1].other_sizes
    assert [m.rule for m in v.margins[:2]] == ["elementwise", "norm"]  # native, then a stress case
    assert v.max_margin == max(m.margin for m in v.margins) < 0.01  # type: ignore[type-var]
    assert v.preset == "ci"
    # where the seconds went, by the parent's clock (the reference may come from its cache: 0.0)
    assert {"reference", "candidate"} <= set(v.phase_s) and 0 < v.phase_s["candidate"] <= v.seconds
    assert v.phase_s["reference"] + v.phase_s["candidate"] <= v.seconds
    # each worker's own account, inside the parent's total for its job (a cached reference has none)
    for job in ("reference", "candidate"):
        mine = {k.split(".", 1)[1]: s for k, s in v.phase_s.items() if k.startswith(job + ".")}
        if job == "candidate" or v.phase_s["reference"] > 0:
            assert {"first_case", "cases"} <= set(mine), (job, v.phase_s)
            assert sum(s for k, s in mine.items() if k != "startup") <= v.phase_s[job]
    assert "candidate.import_candidate" in v.phase_s and "candidate.repeats" in v.phase_s


def test_a_pass_by_a_hair_shows_in_its_margin() -> None:
    hair = HONEST.replace("return torch.sign(z) * (1.0 - e) / (1.0 + e)",
                          "return torch.sign(z) * (1.0 - e) / (1.0 + e) * (1.0 + 7e-5)")
    v = verify(hair)
    assert v.ok, v.detail
    assert v.max_margin is not None and 0.6 < v.max_margin < 1.0


def test_nan_never_passes_and_near_zero_needs_the_norm() -> None:
    ref = np.ones(10)
    assert compare(np.full(10, np.nan), ref, 1e-4)[0] == "nonfinite"
    tiny = np.full(1000, 1e-6)
    assert compare(np.zeros(1000), tiny, 1e-4)[0] == "mismatch"  # atol alone would accept it
    assert compare(tiny * (1 + 1e-7), tiny, 1e-4)[0] is None
    inf_ref = np.array([np.inf, 1.0])
    assert compare(np.array([np.inf, 1.0]), inf_ref, 1e-4)[0] is None
    assert compare(np.array([1.0, 1.0]), inf_ref, 1e-4)[0] == "mismatch"


def test_case_plan_covers_distributions_and_other_sizes() -> None:
    cases = plan_cases(3, {"rows": 49})
    assert [c.dist for c in cases[:4]] == ["native", "signed", "heavy", "scaled"]
    assert len({c.seed for c in cases}) == len(cases)
    assert cases[-1].sizes == {"rows": 49}
    assert alternative_sizes({"rows": 64, "k": 3})[0] == {"rows": 49, "k": 3}


def test_timing_inputs_are_drawn_on_the_device_and_correctness_inputs_on_the_host() -> None:
    seen: list[str] = []

    def get_inputs() -> list[torch.Tensor]:
        x = torch.randn(4, 8)
        seen.append(x.device.type)
        return [x, torch.arange(3)]

    problem = types.SimpleNamespace(get_inputs=get_inputs)
    timed = make_inputs(problem, Case(0, 7, "native", None), "meta", draw_on_device=True)
    assert seen == ["meta"] and [t.device.type for t in timed] == ["meta", "meta"]
    checked = make_inputs(problem, Case(0, 7, "heavy", None), "meta")
    assert seen[-1] == "cpu" and [t.device.type for t in checked] == ["meta", "meta"]
    on_cpu = make_inputs(problem, Case(0, 7, "native", None), "cpu", draw_on_device=True)
    again = make_inputs(problem, Case(0, 7, "native", None), "cpu")
    assert torch.equal(on_cpu[0], again[0])  # the host path is unchanged by the option


def test_degenerate_problem_is_flagged_in_the_verdict() -> None:
    zeros = HONEST.replace('"kforge::scale_tanh"', '"kforge::zeros"').replace(
        "z = x * 2.0 + 1.0\n            e = torch.exp(-2.0 * z.abs())\n"
        "            return torch.sign(z) * (1.0 - e) / (1.0 + e)",
        "return torch.zeros_like(x)",
    )
    v = verify(zeros, FIXTURES / "zero_out.py")
    assert "degenerate" in v.detail and "zero_output_passes" in v.detail


def test_reference_is_computed_with_tf32_off() -> None:
    """PyTorch's default cuDNN TF32 would make a conv reference ~1e-3 off the fp32 answer."""
    from kforge.verifier.inputs import Case
    from kforge.verifier.sandbox import Limits
    from kforge.verifier.verify import _reference

    from .conftest import SCALE_TANH

    assert torch.backends.cudnn.allow_tf32  # PyTorch's default, here in the parent
    job = {"mode": "reference", "problem_path": str(SCALE_TANH), "preset": "ci", "sizes": None,
           "cases": [Case(0, 11, "native", None).to_json()], "device": "cpu", "model_seed": 0}
    out = _reference(job, scratch=None, env={}, limits=Limits(timeout_s=120, memory_mb=None), gpu=False,
                     ro_paths=[SCALE_TANH.parent])
    assert out.reason is None, out.detail
    flags = [f.header["flags"] for f in out.frames if f.header.get("kind") == "case"]
    assert flags and all(not f["cudnn_allow_tf32"] and not f["cuda_matmul_allow_tf32"] for f in flags)


def test_a_stress_case_where_the_fp32_reference_is_off_is_judged_against_float64() -> None:
    """The fp32 reference may be off by more than the strict tolerance on a heavy-tailed input
    (KernelBench's FrobeniusNorm: torch.norm's fp32 sum, 1.2e-4); a candidate within tolerance
    of the float64 answer passes (rule ``exact``), one off both does not."""
    from kforge.verifier.correctness import against_exact, measure

    exact = np.random.default_rng(0).standard_cauchy(4096)
    ref32 = exact * (1 + 2e-4)  # the fp32 reference, itself off
    right, wrong = exact * (1 + 1e-6), exact * (1 - 3e-4)
    for cand, ok in ((right, True), (wrong, False)):
        first = [measure(cand, ref32, 1e-4, "heavy")]
        assert first[0].kind == "mismatch"
        judged = against_exact(first, [cand], [ref32], [exact], 1e-4, "heavy")[0]
        assert (judged.kind is None) is ok and (judged.rule == "exact") is ok


def test_a_whole_model_the_fp32_reference_cannot_answer_is_judged_by_the_reference_s_own_error() -> None:
    """Rule ``as_reference`` (whole models only): where the fp32 reference is itself 1% off the
    float64 answer, an output up to REFERENCE_ERROR_FACTOR times as far passes; one off by the
    output's own size (a wrong wire) does not, nor does the same output without the rule."""
    from kforge.verifier.correctness import REFERENCE_ERROR_FACTOR, against_exact, measure

    rng = np.random.default_rng(1)
    exact = rng.standard_normal(4096)
    ref32 = exact + 1e-2 * rng.standard_normal(4096)
    near = exact + 0.5 * REFERENCE_ERROR_FACTOR * 1e-2 * rng.standard_normal(4096)
    wired_wrong = rng.standard_normal(4096)
    for cand, ok in ((near, True), (wired_wrong, False)):
        first = [measure(cand, ref32, 1e-4, "native")]
        assert first[0].kind == "mismatch"
        judged = against_exact(first, [cand], [ref32], [exact], 1e-4, "native", as_reference=True)[0]
        assert (judged.kind is None) is ok and (judged.rule == "as_reference") is ok
        assert judged.kind is None or judged.margin > 1
        plain = against_exact(first, [cand], [ref32], [exact], 1e-4, "native")[0]
        assert plain.kind == "mismatch"


def test_frobenius_norm_on_heavy_inputs_verifies_against_float64(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """End to end on the CPU: the expert's kernel (sums in double) verifies, where the fp32
    reference alone failed it on the heavy-tailed case; the reference run sends float64 outputs
    for the stress cases only."""
    from kforge.agents.expert.codegen.backend import render_default
    from kforge.agents.expert.plan.planner import plan_problem
    from kforge.verifier.verify import run_verification

    source = (
        "import torch\nimport torch.nn as nn\n\nbatch_size = 64\ndim = 16384\n\n"
        "class Model(nn.Module):\n    def __init__(self):\n        super(Model, self).__init__()\n\n"
        "    def forward(self, x):\n        return x / torch.norm(x, p='fro')\n\n"
        "def get_inputs():\n    return [torch.rand(batch_size, dim)]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    problem = tmp_path / "frobenius.py"
    problem.write_text(source)
    from kforge.platforms import get_platform

    candidate = render_default(plan_problem(source), "cpu", "strict", source)
    assert get_platform("cpu").build(candidate, tmp_path / "build").ok
    v = run_verification(candidate, problem, platform="cpu", policy="strict", build_dir=tmp_path / "build",
                         timeout_s=120)
    assert v.ok, v.detail
    rules = {m.dist: m.rule for m in v.margins if not m.other_sizes}
    assert rules["native"] in ("elementwise", "norm") and "exact" in rules.values(), rules


def test_the_degenerate_note_is_checked_at_the_ci_sizes(tmp_path) -> None:
    """The reference worker's degeneracy note runs the reference twice: at the ci sizes, never
    at the timed ones (here 4e10 elements a tensor, which would not even allocate)."""
    import time as clock

    from kforge.verifier.worker import degenerate_check

    src = '''import torch
import torch.nn as nn

N = 200000
PRESETS = {"ci": {"N": 64}}


class Model(nn.Module):
    def forward(self, x):
        return (x - x) * 3.0


def get_inputs():
    return [torch.randn(N, N)]


def get_init_inputs():
    return []
'''
    path = tmp_path / "huge_zero.py"
    path.write_text(src)
    start = clock.monotonic()
    assert degenerate_check(path) == ["zero_output_passes", "constant_output_passes"]
    assert clock.monotonic() - start < 30
    path.write_text("this is not python")
    assert degenerate_check(path)[0].startswith("unchecked: ")


def test_reference_frames_round_trip_as_raw_bytes_and_a_cut_file_is_refused(tmp_path: Path) -> None:
    """The reference cache keeps blobs as raw bytes (hex JSON doubled a GPU-scale output), and
    a file cut short or with bytes left over is an error, never frames with a blob missing."""
    from kforge.verifier.protocol import Frame
    from kforge.verifier.verify import read_frames, write_frames

    frames = [Frame({"kind": "case", "index": 0}, [bytes(range(256)) * 3, b""]), Frame({"kind": "done"}, [])]
    path = tmp_path / "ref.frames"
    write_frames(path, frames)
    assert path.stat().st_size < 1000 and read_frames(path) == frames
    data = path.read_bytes()
    for broken in (data[:-1], data + b"x"):
        path.write_bytes(broken)
        with pytest.raises(ValueError):
            read_frames(path)


def test_the_candidates_result_cap_is_sized_from_what_the_reference_sent() -> None:
    """A problem whose outputs over every case and repeat call pass the default cap (60's
    ConvTranspose3d: 126 MB x 22 calls) gets room for them; a small one keeps the default."""
    from kforge.verifier.protocol import Frame
    from kforge.verifier.runner import JobOutcome
    from kforge.verifier.sandbox import Limits
    from kforge.verifier.verify import REFERENCE_RESULT_BYTES, candidate_limits

    base = Limits()
    small = JobOutcome([Frame({"kind": "case"}, [b"\0" * 1000])], None, "", "cache", 0.0)
    assert candidate_limits(base, small) == base
    big = JobOutcome([Frame({"kind": "case"}, [b"\0" * (1 << 20)])] * 1200, None, "", "cache", 0.0)
    sized = candidate_limits(base, big)
    assert sized.result_bytes >= 2 * 1200 * (1 << 20) > base.result_bytes
    assert REFERENCE_RESULT_BYTES > base.result_bytes and sized.timeout_s == base.timeout_s


BF16_CANCEL = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return (x * 1.1 + x * 0.7) - x * 1.75  # 0.05 x; in bf16 each op rounds (2^-9 of ~|x|)

def get_inputs():
    return [torch.randn(64, 256, dtype=torch.bfloat16)]

def get_init_inputs():
    return []
'''


@pytest.mark.parametrize("factor, ok", [(1.0, True), (2.0, False)])
def test_a_bf16_problem_is_judged_against_float64_with_the_reference_s_own_error(tmp_path: Path, factor: float,
                                                                                 ok: bool) -> None:
    """A bf16 reference rounds every op's result: here it is ~8% off the float64 answer, past
    the relaxed tolerance, while a kernel computing in f32 and rounding once is 0.2% off. A
    bf16 answer is judged against float64 too (rule ``exact``, or ``as_reference``: within the
    reference's own error), in the cases and the repeat phase, which a bf16 attention failed as
    ``stale_output``; a kernel twice the answer still fails."""
    from kforge.verifier.verify import run_verification

    problem = tmp_path / "bf16_cancel.py"
    problem.write_text(BF16_CANCEL)
    candidate = f'''
import torch
import torch.nn as nn
from torch.profiler import record_function

class ModelNew(nn.Module):
    def forward(self, x):
        with record_function("kforge::cancel"):
            v = x.float()
            return (v * ((1.1 + 0.7 - 1.75) * {factor})).to(torch.bfloat16)
'''
    v = run_verification(candidate, problem, platform="cpu", policy="relaxed", timeout_s=120, static=False)
    assert v.ok is ok, v.detail
    if ok:
        rules = {m.dist: m.rule for m in v.margins if not m.other_sizes}
        assert rules["native"] in ("exact", "as_reference"), rules  # the native case too, not only stress ones
    else:
        assert v.reason == "output_mismatch", v.reason
