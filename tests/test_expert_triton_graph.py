"""The Triton backend's ``cuda_graph`` knob (kforge/agents/expert/triton_graph.py): which
programs get it, and what the rendered candidate looks like. The replay itself needs a GPU:
tests/platforms/test_gpu_graph.py runs it on the H200."""

from __future__ import annotations

from kforge.agents.expert.planner import plan_problem
from kforge.agents.expert.triton_graph import graphable, writes_state
from kforge.agents.expert.triton_render import default_knobs, render_triton
from kforge.verifier.checks import static_check

from .test_expert_compiler import LINEAR, problem

GEMM = problem(LINEAR, "return torch.sigmoid(self.linear(x)) * 1.5", "[torch.randn(64, 96)]", "[96, 80]")
BATCHNORM = problem("self.bn = nn.BatchNorm1d(args[0])", "return torch.tanh(self.bn(x))", "[torch.randn(8, 16)]", "[16]")


def _render(source: str, policy: str = "relaxed") -> tuple[dict, str]:
    prog = plan_problem(source)
    knobs = default_knobs(prog, policy)
    return knobs, render_triton(prog, knobs, policy, source)


def test_a_stateless_program_replays_its_launches_from_a_graph() -> None:
    knobs, src = _render(GEMM)
    assert [kv.get("cuda_graph") for kv in knobs.values()][0] == 1
    assert "def forward(self, *args):\n        return _kf_graphed(self, self._kf_forward, args)" in src
    assert src.count("def _kf_forward(self, x0):") == 1
    # every call still runs every kernel: the wrapper keys graphs on buffers, never on values
    assert "graph.replay()" in src and "_kf_copy_out(out)" in src
    assert static_check(src, GEMM, platform="triton") == []
    compile(src, "cand.py", "exec")


def test_a_program_that_writes_module_state_stays_eager() -> None:
    # BatchNorm in training mode updates its running statistics: a Python-side write would
    # run at capture only, so the program never gets the knob, even when asked for it
    prog = plan_problem(BATCHNORM)
    assert writes_state(prog) and not graphable(prog)
    knobs = default_knobs(prog, "strict")
    assert not any(kv.get("cuda_graph") for kv in knobs.values())
    forced = {name: {**kv, "cuda_graph": 1} for name, kv in knobs.items()}
    assert "_kf_graphed" not in render_triton(prog, forced, "strict", BATCHNORM)


def test_a_python_scalar_input_stays_eager() -> None:
    # its host-to-device copy cannot be captured
    src = GEMM.replace("def forward(self, x):", "def forward(self, x, s):").replace(
        "return torch.sigmoid(self.linear(x)) * 1.5", "return torch.sigmoid(self.linear(x)) * s").replace(
        "return [torch.randn(64, 96)]", "return [torch.randn(64, 96), 1.5]")
    prog = plan_problem(src)
    assert not graphable(prog)
    assert "_kf_graphed" not in render_triton(prog, default_knobs(prog, "strict"), "strict", src)
