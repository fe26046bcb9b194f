"""Convolutions as implicit GEMMs in the Triton backend: the A tile gathered from the input inside
the K loop (no im2col buffer), the weight read through strides (no copy), the tail computed and
stored in ``[N, CO, *out]`` by the GEMM's epilogue; checked under the CPU interpreter against
PyTorch at odd sizes, strides, dilations, groups, paddings and transposed phases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kforge.agents.expert.codegen.backend import get_backend
from kforge.agents.expert.plan.expr import E, const, iadd, ifloordiv, imul, var
from kforge.agents.expert.plan.gather import index_map, inline_gathers, invariant_parts
from kforge.agents.expert.plan.kernels import GemmKernel
from kforge.agents.expert.plan.planner import plan_problem

TEMPLATE = """import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, cin, cout, groups):
        super().__init__()
        self.conv = nn.{cls}(cin, cout, {k}, stride={s}, padding={p}, dilation={d}, groups=groups{extra})

    def forward(self, x):
        return {tail}


def get_inputs():
    return [torch.randn({shape})]


def get_init_inputs():
    return [{cin}, {cout}, {g}]  # channels and groups from the init inputs, as in KernelBench: symbolic
"""

# (conv class, cin, cout, kernel, stride, padding, dilation, groups, extra args, tail, input shape)
CASES = {
    "conv1d_s2_d2": ("Conv1d", 3, 5, 3, 2, 2, 2, 1, "", "torch.relu(self.conv(x)) * 0.5", "2, 3, 17"),
    "conv2d_odd": ("Conv2d", 3, 6, 3, 1, 1, 1, 1, "", "torch.sigmoid(self.conv(x)) + 1.0", "2, 3, 7, 9"),
    "conv2d_rect_s2": ("Conv2d", 4, 8, (3, 2), (2, 1), (0, 1), (1, 2), 1, "", "self.conv(x).tanh()", "1, 4, 11, 6"),
    "conv2d_groups": ("Conv2d", 6, 9, 3, 1, 1, 1, 3, "", "F.gelu(self.conv(x))", "2, 6, 5, 7"),
    "conv2d_depthwise": ("Conv2d", 4, 4, 3, 2, 1, 1, 4, "", "self.conv(x) - 0.25", "2, 4, 9, 8"),
    "conv3d": ("Conv3d", 2, 4, 3, 1, (1, 0, 1), 1, 1, "", "self.conv(x).clamp(-0.5, 0.5)", "1, 2, 5, 6, 4"),
    "convt2d_s2": ("ConvTranspose2d", 4, 3, 3, 2, 1, 1, 1, ", output_padding=1", "torch.relu(self.conv(x))",
                   "2, 4, 5, 6"),
    "convt1d_groups_d2": ("ConvTranspose1d", 4, 6, 3, 3, 2, 2, 2, ", output_padding=1", "self.conv(x) * 2.0",
                          "2, 4, 7"),
    "convt3d": ("ConvTranspose3d", 2, 3, 2, 2, 0, 1, 1, "", "self.conv(x) + 0.1", "1, 2, 3, 4, 3"),
}


def source(case: str) -> str:
    cls, cin, cout, k, s, p, d, g, extra, tail, shape = CASES[case]
    return TEMPLATE.format(cls=cls, cin=cin, cout=cout, k=k, s=s, p=p, d=d, g=g, extra=extra, tail=tail,
                           shape=shape)


RUNNER = """
import importlib.util, json, sys, torch
torch.backends.cudnn.allow_tf32 = False
done = []
for case, cand, prob in json.loads(sys.argv[1]):
    spec = importlib.util.spec_from_file_location("cand_" + case, cand)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ns = {}
    exec(compile(open(prob).read(), prob, "exec"), ns)
    torch.manual_seed(0)
    ref = ns["Model"](*ns["get_init_inputs"]())
    new = mod.ModelNew(*ns["get_init_inputs"]())
    new.load_state_dict(ref.state_dict())
    x = ns["get_inputs"]()[0]
    with torch.no_grad():
        want, got = ref(x), new(x)
    assert got.shape == want.shape, (case, got.shape, want.shape)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, msg=lambda m: case + ": " + m)
    done.append(case)
print(json.dumps(done))
"""


def test_implicit_gemm_convs_match_pytorch_under_the_interpreter(tmp_path: Path) -> None:
    backend = get_backend("triton")
    jobs = []
    for case in CASES:
        src = source(case)
        program = plan_problem(src)
        knobs = backend.fit(program, backend.default_knobs(program, "strict"), "strict")
        gathered = [k for k in program.kernels if isinstance(k, GemmKernel) and k.a.gather is not None]
        assert gathered, f"{case}: no GEMM reads its A operand through an index map"
        assert all(knobs.kernels[k.name].gather for k in gathered)  # type: ignore[attr-defined]
        cand, prob = tmp_path / f"cand_{case}.py", tmp_path / f"prob_{case}.py"
        text = backend.render(program, knobs, "strict", src)
        assert "ga_k = (k0 + rk)" in text, case
        cand.write_text(text)
        prob.write_text(src)
        jobs.append((case, str(cand), str(prob)))
    runner = tmp_path / "run.py"
    runner.write_text(RUNNER)
    proc = subprocess.run([sys.executable, str(runner), json.dumps(jobs)], capture_output=True, text=True,
                          env={**os.environ, "TRITON_INTERPRET": "1"}, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == list(CASES)


def test_a_conv_is_one_gemm_kernel_with_its_tail_for_triton_and_keeps_im2col_elsewhere() -> None:
    src = source("conv2d_odd")
    program = plan_problem(src)
    # the weight's [CO, C, kh, kw] -> [CO, C*kh*kw]^T is a strided operand, not a copy
    (gemm,) = [k for k in program.kernels if isinstance(k, GemmKernel)]
    assert gemm.b.buffer.startswith("param") and gemm.b.gather is None
    # the tail (sigmoid + 1) rides in the GEMM's epilogue, stored in [N, CO, H, W] order
    assert [k.kind for k in program.kernels] == ["pointwise", "gemm"]  # the im2col prologue, then the GEMM
    (out,) = program.outputs
    assert [st.buffer for st in gemm.stores] == [out]
    assert program.buffers[out].shape == tuple(program.buffers[out].shape)
    assert any("index map" in r.reason for r in program.refusals)
    inlined = inline_gathers(program, {gemm.name})
    assert [k.kind for k in inlined.kernels] == ["gemm"]
    assert gemm.a.buffer not in inlined.buffers and gemm.a.buffer in program.buffers
    # not asked for: the program is unchanged (the CPU and CUDA backends read the stored im2col)
    assert inline_gathers(program, set()).kernels == program.kernels


def test_index_maps_and_their_loop_invariant_parts() -> None:
    m, k = var("g1", 100), var("g2", 27)
    row = ifloordiv(m, const(10))
    load = E("load", (iadd(imul(row, const(7)), ifloordiv(k, const(9))),), v="input0", dt="f32")
    assert index_map(load)
    assert not index_map(E("exp", (load,), dt="f32"))  # float math: stored by a prologue instead
    assert not index_map(iadd(m, k))  # reads no buffer
    parts = invariant_parts(load, "g2")
    assert imul(row, const(7)) in parts and not any(x.op == "load" for x in parts)
    assert all("g2" not in repr(p) for p in parts)
