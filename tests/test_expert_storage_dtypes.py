"""bf16 and f16 tensors (a model's weights and activations): the expert computes in f32, loads
them as f32 and rounds once where it writes a buffer the problem returns in that type, as
Inductor computes a bf16 model. The Triton backend renders them (checked under the interpreter:
the outputs' dtype and values against the reference's own bf16 / f16 forward); the backends
whose kernels take f32 pointers refuse them with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kforge.agents.expert.codegen.backend import render_default
from kforge.agents.expert.errors import UnsupportedError
from kforge.agents.expert.plan.planner import plan_problem

# A Llama MLP block as transformers writes it in bf16: RMSNorm in f32, the gated GEMMs in bf16.
SWIGLU = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.w = nn.Parameter(torch.rand(d, dtype=torch.bfloat16) + 0.5)
        self.up = nn.Linear(d, h, bias=False, dtype=torch.bfloat16)
        self.gate = nn.Linear(d, h, bias=False, dtype=torch.bfloat16)

    def forward(self, x):
        v = x.float()
        v = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6)
        y = self.w * v.to(torch.bfloat16)
        return torch.nn.functional.silu(self.gate(y)) * self.up(y)

def get_inputs():
    return [torch.randn(7, 40, dtype=torch.bfloat16)]

def get_init_inputs():
    return [40, 52]
"""

# f16 in, two outputs: one returned in f16, one upcast to f32 by the forward.
HALF = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x, y):
        s = torch.sigmoid(x) * y + 1.0
        return s, s.float().sum(-1)

def get_inputs():
    return [torch.randn(5, 33, dtype=torch.float16), torch.randn(5, 33, dtype=torch.float16)]

def get_init_inputs():
    return []
"""

RUN = """
import json, sys, torch
results = {}
for name, problem, candidate in json.loads(open(sys.argv[1]).read()):
    ns, cand = {}, {}
    exec(compile(problem, "problem", "exec"), ns)
    exec(compile(candidate, "candidate", "exec"), cand)
    torch.manual_seed(0)
    ref = ns["Model"](*ns["get_init_inputs"]())
    new = cand["ModelNew"](*ns["get_init_inputs"]())
    new.load_state_dict(ref.state_dict())
    torch.manual_seed(1)
    inputs = ns["get_inputs"]()
    with torch.no_grad():
        r, c = ref(*inputs), new(*inputs)
    r, c = (r, c) if isinstance(r, tuple) else ((r,), (c,))
    results[name] = [{"ref": str(a.dtype), "out": str(b.dtype), "shape": list(b.shape) == list(a.shape),
                      "err": float(((b.double() - a.double()).abs() / (1e-2 + 1e-2 * a.double().abs())).max())}
                     for a, b in zip(r, c)]
print(json.dumps(results))
"""
CASES = {"swiglu_relaxed": (SWIGLU, "relaxed"), "swiglu_strict": (SWIGLU, "strict"), "half": (HALF, "relaxed")}


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, object]]]:
    """Every case's Triton candidate run under the interpreter, in one process (one start-up)."""
    folder = tmp_path_factory.mktemp("storage")
    cases = [[name, problem, render_default(plan_problem(problem), "triton", policy, problem)]
             for name, (problem, policy) in CASES.items()]
    (folder / "cases.json").write_text(json.dumps(cases))
    (folder / "run.py").write_text(RUN)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(folder / "run.py"), str(folder / "cases.json")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_storage_types_compute_in_f32_and_are_kept_in_memory() -> None:
    program = plan_problem(SWIGLU)
    held = {b.source or b.name: b.stored for b in program.buffers.values() if b.kind in ("input", "param")}
    assert set(held.values()) == {"bf16"} and len(held) == 4  # x and the three weights
    assert all(b.dtype == "f32" for b in program.buffers.values())  # every value computes in f32
    outs = [program.buffers[o] for o in program.outputs]
    assert [b.stored for b in outs] == ["bf16"]
    temps = [b for b in program.buffers.values() if b.kind == "temp" and b.name not in program.outputs]
    assert temps and all(b.stored == "f32" for b in temps)  # between kernels: f32, not rounded


@pytest.mark.parametrize("policy", ["relaxed", "strict"])
def test_bf16_swiglu_on_triton_matches_the_bf16_reference(interpreted: dict[str, list[dict[str, object]]],
                                                          policy: str) -> None:
    (row,) = interpreted[f"swiglu_{policy}"]
    assert row["ref"] == row["out"] == "torch.bfloat16" and row["shape"]
    # within the relaxed tolerance (|c - r| <= 1e-2 + 1e-2 |r|): the reference rounds every op's
    # result to bf16 (2^-9 relative), the kernel only what it returns
    assert row["err"] < 1.0, row


def test_f16_outputs_keep_each_returned_type(interpreted: dict[str, list[dict[str, object]]]) -> None:
    first, second = interpreted["half"]
    assert first["ref"] == first["out"] == "torch.float16"
    assert second["ref"] == second["out"] == "torch.float32"
    assert first["err"] < 1.0 and second["err"] < 1.0, (first, second)


@pytest.mark.parametrize("platform", ["cpu", "cuda"])
def test_backends_with_f32_pointers_refuse_storage_types(platform: str) -> None:
    with pytest.raises(UnsupportedError, match=f"dtype bf16 on the {platform} backend"):
        render_default(plan_problem(SWIGLU), platform, "relaxed", SWIGLU)


def test_an_input_returned_in_another_type_is_refused() -> None:
    upcast = SWIGLU.replace("return torch.nn.functional.silu(self.gate(y)) * self.up(y)", "return x.float()")
    with pytest.raises(UnsupportedError, match="a value held as bf16 returned as f32"):
        plan_problem(upcast)
