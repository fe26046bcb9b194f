"""The Triton backend's ``cuda_graph`` knob (kforge/agents/expert/codegen/triton/graph.py): which
programs get it, and what the rendered candidate looks like. The replay itself needs a GPU:
tests/platforms/test_gpu_graph.py runs it on the H200."""

from __future__ import annotations

from typing import Any

import pytest

from kforge.agents.expert.analysis import recommend
from kforge.agents.expert.analysis.triton import host_gap_ms
from kforge.agents.expert.codegen.backend import get_backend, render_default
from kforge.agents.expert.codegen.triton.graph import graphable, writes_state
from kforge.agents.expert.plan.knobs import TritonProgram
from kforge.agents.expert.plan.planner import plan_problem
from kforge.agents.expert.plan.rounds import apply_action
from kforge.schema import AnalysisRequest, KernelStat, Profile, Timing
from kforge.verifier.checks import static_check

from .test_expert_compiler import LINEAR, problem
from .test_expert_helpers import gemm_knobs

TRITON = get_backend("triton")

GEMM = problem(LINEAR, "return torch.sigmoid(self.linear(x)) * 1.5", "[torch.randn(64, 96)]", "[96, 80]")
BATCHNORM = problem("self.bn = nn.BatchNorm1d(args[0])", "return torch.tanh(self.bn(x))", "[torch.randn(8, 16)]", "[16]")


def test_the_knob_starts_on_and_renders_a_replaying_forward() -> None:
    prog = plan_problem(GEMM)
    knobs = TRITON.default_knobs(prog, "relaxed")
    assert knobs.program == TritonProgram(cuda_graph=1, graphable=True)  # on from round 0
    off = knobs.with_program(TritonProgram(cuda_graph=0, graphable=True))
    assert "_kf_graphed" not in TRITON.render(prog, off, "relaxed", GEMM)
    src = TRITON.render(prog, knobs, "relaxed", GEMM)
    assert "def forward(self, *args):\n        return _kf_graphed(self, self._kf_forward, args)" in src
    assert src.count("def _kf_forward(self, x0):") == 1
    # every call still runs every kernel: the wrapper keys graphs on buffers, never on values
    assert "graph.replay()" in src and "_kf_capture(fn, args, None)" in src
    # a result the caller still holds is never rewritten: a second graph, its output copied
    assert "_kf_map(torch.Tensor.clone, copier[1])" in src and "if lend and _kf_returned(refs):" in src
    assert static_check(src, GEMM, platform="triton") == []
    compile(src, "cand.py", "exec")


def test_a_program_that_writes_module_state_stays_eager() -> None:
    # BatchNorm in training mode updates its running statistics: a Python-side write would
    # run at capture only, so the program never gets the knob, even when asked for it
    prog = plan_problem(BATCHNORM)
    assert writes_state(prog) and not graphable(prog)
    knobs = TRITON.default_knobs(prog, "strict")
    assert knobs.program == TritonProgram(cuda_graph=0, graphable=False) and knobs.program_json() == {}
    forced, notes = apply_action(knobs, "k0", "graph", {"cuda_graph": 1})
    assert forced == knobs and "is no knob" in notes[0]
    assert "_kf_graphed" not in TRITON.render(prog, forced, "strict", BATCHNORM)


def test_a_python_scalar_input_stays_eager() -> None:
    # its host-to-device copy cannot be captured
    src = GEMM.replace("def forward(self, x):", "def forward(self, x, s):").replace(
        "return torch.sigmoid(self.linear(x)) * 1.5", "return torch.sigmoid(self.linear(x)) * s").replace(
        "return [torch.randn(64, 96)]", "return [torch.randn(64, 96), 1.5]")
    prog = plan_problem(src)
    assert not graphable(prog)
    assert "_kf_graphed" not in render_default(prog, "triton", "strict", src)


def _profile(ms: float, kernel_us: list[float], calls: int = 3) -> Profile:
    timing = Timing(median_ms=ms, mean_ms=ms, cv=0.01, reps=30, min_ms=ms)
    return Profile(ok=True, device="cuda", candidate=timing, eager=timing.model_copy(update={"median_ms": 2.8}),
                   kernels=[KernelStat(name=f"k{i}", calls=calls, total_us=us * calls) for i, us in enumerate(kernel_us)],
                   flops=2.0 * 1024 * 8192 * 8192, min_bytes=4.0 * (2 * 1024 * 8192 + 8192 * 8192))


def gemm_plan(knobs: Any, graph_knob: int | None = 1) -> dict[str, Any]:
    """An expert plan of one GEMM kernel ``k0`` with these knobs (1024 x 8192 x 8192)."""
    return {"platform": "triton", "compiler": "fusion-v2", "kernels": [{"name": "k0", "kind": "gemm", "stores": 1}],
            "knobs": {"k0": knobs.to_json()}, "program_knobs": {} if graph_knob is None else {"cuda_graph": graph_knob},
            "precision": knobs.precision, "dominant": "k0",
            "graph": {"pattern": {"kind": "gemm", "m": 1024, "n": 8192, "k": 8192}}}


def _advice(profile: Profile, graph_knob: int | None) -> Any:
    plan = gemm_plan(gemm_knobs(precision="bf16", BLOCK_N=256, num_stages=4, b_regs=0, tma=0), graph_knob)
    return recommend(AnalysisRequest(problem_name="p", platform="triton", policy="relaxed",
                                     candidate_source="", profile=profile, plan=plan))


def test_the_analysis_asks_for_the_graph_when_the_gpu_idles_between_launches() -> None:
    # The H200 select table of 001 relaxed: a 193 us GEMM and two precasts (54 us each) in a
    # 619 us call: ~320 us of the call with the GPU idle
    idle = _profile(0.619, [193.0, 54.0, 54.0])
    advice = _advice(idle, graph_knob=0)
    assert advice.bottleneck == "launch" and advice.actions[0].params == {"cuda_graph": 1}
    assert advice.evidence["host_gap_ms"] == pytest.approx(0.318, abs=1e-3)
    # not graphable (no knob): no such advice
    assert all(a.params != {"cuda_graph": 1} for a in _advice(idle, graph_knob=None).actions)
    assert all(a.kind != "graph" for a in _advice(idle, graph_knob=None).actions)
    # a busy GPU (kernels fill the call): nothing about launches
    busy = _advice(_profile(0.31, [193.0, 54.0, 54.0]), graph_knob=0)
    assert busy.bottleneck != "launch"


def test_operator_rows_do_not_count_their_kernels_twice() -> None:
    """The H100 select table of 001 relaxed with the graph on: the GEMM (293.6 us a call), A's
    precast (17.1 us) and the copy out of the graph's memory (20.6 us), which the profiler lists
    three times (aten::clone, aten::copy_ and the memcpy itself), in a 0.4195 ms call."""
    table = {"k0": 293.55, "aten::clone": 20.55, "aten::copy_": 20.55, "Memcpy DtoD (Device -> Device)": 20.55,
             "_kf_precast_kernel": 17.09}
    timing = Timing(median_ms=0.4195, mean_ms=0.4195, cv=0.01, reps=30, min_ms=0.4195)
    profile = Profile(ok=True, device="cuda", candidate=timing,
                      kernels=[KernelStat(name=n, calls=3, total_us=us * 3) for n, us in table.items()])
    assert host_gap_ms(profile) == pytest.approx(0.4195 - (293.55 + 20.55 + 17.09) / 1000, abs=1e-6)


def test_the_graph_action_reaches_the_next_rounds_knobs() -> None:
    knobs = TRITON.default_knobs(plan_problem(GEMM), "relaxed").with_program(TritonProgram(0, graphable=True))
    on, notes = apply_action(knobs, "k0", "graph", {"cuda_graph": 1})
    assert on.program == TritonProgram(1, graphable=True) and notes == ["program: graph {'cuda_graph': 1}"]


def test_a_graph_that_leaves_the_gpu_idle_is_turned_off() -> None:
    # the knob is on and the call still idles as it did without it: the calls came on buffers
    # no graph was captured for, so the analysis turns the knob off (the eager path is lighter)
    idle = _advice(_profile(0.619, [193.0, 54.0, 54.0]), graph_knob=1)
    assert idle.bottleneck == "launch" and idle.actions[0].params == {"cuda_graph": 0}
    # replayed (kernels fill the call): the knob stays, the advice is about the kernels
    replayed = _advice(_profile(0.31, [193.0, 54.0, 54.0]), graph_knob=1)
    assert all(a.kind != "graph" for a in replayed.actions)


def test_a_replayed_graph_stays_on_despite_the_hosts_share_of_the_call() -> None:
    """001 relaxed on the H100: the graph replays (its output's copy, a device-to-device memcpy
    every call) and the GPU still idles 0.088 ms of the 0.4195 ms call, the host's part of a
    replayed call; without the graph the call took 0.47 ms, so the knob stays on."""
    table = {"k0": 293.55, "aten::clone": 20.55, "aten::copy_": 20.55, "Memcpy DtoD (Device -> Device)": 20.55,
             "_kf_precast_kernel": 17.09}
    timing = Timing(median_ms=0.4195, mean_ms=0.4195, cv=0.01, reps=30, min_ms=0.4195)

    def profile(rows: dict[str, float]) -> Profile:
        return Profile(ok=True, device="cuda", candidate=timing, eager=timing.model_copy(update={"median_ms": 2.85}),
                       kernels=[KernelStat(name=n, calls=3, total_us=us * 3) for n, us in rows.items()],
                       flops=2.0 * 1024 * 8192 * 8192, min_bytes=4.0 * (2 * 1024 * 8192 + 8192 * 8192))

    on = _advice(profile(table), graph_knob=1)
    assert on.evidence["host_gap_ms"] > 0.15 * 0.4195
    assert all(a.kind != "graph" for a in on.actions) and on.bottleneck != "launch"
    # a replay that lends its output makes no copy; its launches are the table's host rows
    lent = {n: us for n, us in table.items() if n.startswith(("k0", "_kf"))}
    launches = Profile(**{**profile(lent).model_dump(), "kernels": [
        *profile(lent).kernels, KernelStat(name="cudaGraphLaunch", calls=3, total_us=0.0)]})
    kept = _advice(launches, graph_knob=1)
    assert all(a.kind != "graph" for a in kept.actions) and kept.evidence["kernels"] == 2
    # the same gap with no copy in the table: the graph never replayed, so it goes off
    eager = {n: us for n, us in table.items() if n.startswith(("k0", "_kf"))}
    off = _advice(profile(eager), graph_knob=1)
    assert off.actions[0].params == {"cuda_graph": 0}


def test_the_fuse_advice_counts_kernels_not_operator_rows() -> None:
    """001's table (graph on, A precast, the weight rounded in registers) is the three kernels
    the plan makes: no advice to fuse; an unplanned fourth kernel is one."""
    plan = gemm_plan(gemm_knobs(precision="fp16", BLOCK_M=256, b_regs=1))
    rows = {"k0": 293.55, "aten::clone": 20.55, "aten::copy_": 20.55, "Memcpy DtoD (Device -> Device)": 20.55,
            "_kf_precast_kernel": 17.09}
    timing = Timing(median_ms=0.35, mean_ms=0.35, cv=0.01, reps=30, min_ms=0.35)

    def advice(table: dict[str, float]) -> Any:
        profile = Profile(ok=True, device="cuda", candidate=timing, eager=timing.model_copy(update={"median_ms": 2.8}),
                          kernels=[KernelStat(name=n, calls=3, total_us=us * 3) for n, us in table.items()],
                          flops=2.0 * 1024 * 8192 * 8192, min_bytes=4.0 * (2 * 1024 * 8192 + 8192 * 8192))
        return recommend(AnalysisRequest(problem_name="p", platform="triton", policy="relaxed",
                                         candidate_source="", profile=profile, plan=plan))

    fitted = advice(rows)
    assert fitted.evidence["kernels"] == 3 and all(a.kind != "fuse" for a in fitted.actions)
    extra = advice({**rows, "elementwise_kernel": 15.0})
    assert extra.actions[0].kind == "fuse" and "4 kernels where 3 suffice" in extra.actions[0].rationale


def test_no_advice_for_a_pipeline_that_cannot_fit() -> None:
    """001 relaxed (fp16, weight in registers, 256 x 128 x 64, 3 stages): a fourth stage needs
    256 KB of shared memory, the fitting takes it back to three, and the next round would be the
    same kernel; the analysis says so instead of advising it. Half the stages' bytes (BLOCK_K
    32) and the fourth stage is advised."""
    kv = gemm_knobs(precision="fp16", BLOCK_M=256, BLOCK_N=128, BLOCK_K=64, num_stages=3, b_regs=1)
    table = {"k0": 293.55, "Memcpy DtoD (Device -> Device)": 20.55, "_kf_precast_kernel": 17.09}
    timing = Timing(median_ms=0.4195, mean_ms=0.4195, cv=0.01, reps=30, min_ms=0.4195)
    profile = Profile(ok=True, device="cuda", candidate=timing, eager=timing.model_copy(update={"median_ms": 2.85}),
                      kernels=[KernelStat(name=n, calls=3, total_us=us * 3) for n, us in table.items()],
                      flops=2.0 * 1024 * 8192 * 8192, min_bytes=4.0 * (2 * 1024 * 8192 + 8192 * 8192))

    def advice(knobs: Any) -> Any:
        return recommend(AnalysisRequest(problem_name="p", platform="triton", policy="relaxed",
                                         candidate_source="", profile=profile, plan=gemm_plan(knobs)))

    full = advice(kv)
    assert full.actions == [] and "no knob change left that fits" in full.summary
    assert [a.params for a in advice(kv.with_params({"BLOCK_K": 32})[0]).actions] == [{"num_stages": 4}]
