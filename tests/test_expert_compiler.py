"""The expert's fusion compiler: capture -> IR -> planner, one test per op family.

Problems are written inline in KernelBench's style (``super(Model, self).__init__()``, sizes
through ``get_init_inputs``, models left in training mode) at tiny sizes; the last tests run
the Triton backend under the interpreter at two different sizes of one source.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kforge.agents.expert.errors import NondeterministicReference, UnsupportedError
from kforge.agents.expert.plan.kernels import GemmKernel, PointwiseKernel, RowKernel, ScanKernel
from kforge.agents.expert.plan.planner import plan_problem

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"


def problem(init: str, forward: str, inputs: str, init_args: str = "[]", consts: str = "") -> str:
    return HEAD + consts + textwrap.dedent(f"""
class Model(nn.Module):
    def __init__(self, *args):
        super(Model, self).__init__()
{textwrap.indent(textwrap.dedent(init), '        ') if init.strip() else '        pass'}

    def forward(self, x):
{textwrap.indent(textwrap.dedent(forward), '        ')}


def get_inputs():
    return {inputs}


def get_init_inputs():
    return {init_args}
""")


LINEAR = "self.linear = nn.Linear(args[0], args[1])"


def kinds(source: str) -> list[str]:
    return [k.kind for k in plan_problem(source).kernels]


def test_gemm_epilogue_is_one_kernel_and_shape_generic():
    src = problem(LINEAR, "x = self.linear(x)\nreturn torch.sigmoid(x) * x * 2.0",
                  "[torch.randn(64, 96)]", "[96, 80]")
    prog = plan_problem(src)
    assert [k.kind for k in prog.kernels] == ["gemm"]
    gemm = prog.kernels[0]
    assert isinstance(gemm, GemmKernel)
    # sizes stay symbolic: nothing of the traced 64 x 96 x 80 is baked into the kernel
    assert not any(getattr(s, "is_number", False) for s in (gemm.m, gemm.n, gemm.k))
    assert gemm.b.strides[1].op == "const" and gemm.b.strides[1].v == 1  # W^T read in place


def test_gemm_softmax_fuses_the_row_work_into_one_kernel():
    src = problem(LINEAR, "return torch.softmax(self.linear(x), dim=1)", "[torch.randn(8, 32)]", "[32, 48]")
    prog = plan_problem(src)
    assert [k.kind for k in prog.kernels] == ["gemm", "row"]
    row = prog.kernels[1]
    assert isinstance(row, RowKernel) and row.passes == 2 and row.full_stores


def test_groupnorm_and_batchnorm_training():
    gn = problem(LINEAR + "\nself.gn = nn.GroupNorm(args[2], args[1])", "return torch.relu(self.gn(self.linear(x)))",
                 "[torch.randn(8, 32)]", "[32, 64, 4]")
    prog = plan_problem(gn)
    assert [k.kind for k in prog.kernels] == ["gemm", "row"]
    bn = problem(LINEAR + "\nself.bn = nn.BatchNorm1d(args[1])", "return self.bn(self.linear(x))",
                 "[torch.randn(8, 32)]", "[32, 64]")
    prog = plan_problem(bn)
    row = next(k for k in prog.kernels if isinstance(k, RowKernel))
    assert not row.red_inner  # batch statistics: a column reduction
    written = {st.buffer for k in prog.kernels for st in getattr(k, "stores", []) + getattr(k, "outer_stores", [])}
    params = {b.name for b in prog.buffers.values() if b.kind == "param" and b.source.endswith(("running_mean", "running_var"))}
    assert params <= written  # running statistics are updated, as in the reference


def test_reductions_over_any_dims_pools_and_scans():
    red = problem("", "return x.sum(dim=0) * x.amax(dim=(0, 2))[:, None]",
                  "[torch.randn(4, 6, 5)]")
    assert "row" in kinds(red)
    pool = problem("self.pool = nn.MaxPool1d(3, 2)", "return self.pool(x.unsqueeze(1)).squeeze(1)",
                   "[torch.randn(8, 20)]")
    assert kinds(pool) == ["row"]
    scan = problem("", "return torch.cumsum(x.flip(1), dim=1).flip(1)", "[torch.randn(4, 10)]")
    prog = plan_problem(scan)
    assert any(isinstance(k, ScanKernel) for k in prog.kernels)
    arg = problem("", "return torch.argmax(x, dim=1)", "[torch.randn(4, 10)]")
    row = plan_problem(arg).kernels[0]
    assert isinstance(row, RowKernel) and row.reductions[0].kind == "argmax"


def test_prologue_two_gemms_bmm_and_transposes():
    pro = problem(LINEAR, "return self.linear(torch.relu(x) * 0.5)", "[torch.randn(8, 16)]", "[16, 24]")
    assert kinds(pro) == ["pointwise", "gemm"]
    two = problem(LINEAR + "\nself.l2 = nn.Linear(args[1], args[0])", "return self.l2(torch.tanh(self.linear(x)))",
                  "[torch.randn(8, 16)]", "[16, 24]")
    assert kinds(two) == ["gemm", "gemm"]
    bmm = problem("self.w = nn.Parameter(torch.randn(args[0], args[0]))", "return torch.bmm(x, x.transpose(1, 2)) @ self.w",
                  "[torch.randn(3, 8, 8)]", "[8]")
    assert kinds(bmm).count("gemm") == 2


def test_nondeterministic_reference_and_unsupported_ops_are_named():
    drop = problem("self.d = nn.Dropout(0.3)", "return self.d(x)", "[torch.randn(4, 4)]")
    with pytest.raises(NondeterministicReference, match="^nondeterministic_reference"):
        plan_problem(drop)
    sort = problem("pass", "return torch.sort(x, dim=-1).values", "[torch.randn(4, 8)]")
    with pytest.raises(UnsupportedError, match="sort"):
        plan_problem(sort)


RUNNER = """
import importlib.util, sys, torch
cand, prob = sys.argv[1], sys.argv[2]
init, sizes = eval(sys.argv[3]), eval(sys.argv[4])
spec = importlib.util.spec_from_file_location("cand", cand)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
ns = {}
exec(compile(open(prob).read(), "<p>", "exec"), ns)
for shape in sizes:  # one candidate, several sizes: nothing size-specific was generated
    torch.manual_seed(0)
    ref = ns["Model"](*init)
    new = mod.ModelNew(*init)
    new.load_state_dict(ref.state_dict())
    x = eval(shape) if isinstance(shape, str) else torch.randn(*shape)  # a str: integer ids
    with torch.no_grad():
        torch.testing.assert_close(new(x), ref(x), atol=1e-4, rtol=1e-4)
print("ok")
"""


def _run_triton(source: str, tmp_path: Path, sizes: list[tuple[int, ...]], init: list, policy: str = "strict") -> None:
    """The Triton candidate under the CPU interpreter (its own process: the interpreter is
    chosen when Triton is imported), against the reference at each size."""
    from kforge.agents.expert.codegen.backend import render_default

    prog = plan_problem(source)
    cand, prob, runner = tmp_path / "cand.py", tmp_path / "prob.py", tmp_path / "run.py"
    cand.write_text(render_default(prog, "triton", policy, source))
    prob.write_text(source)
    runner.write_text(RUNNER)
    proc = subprocess.run([sys.executable, str(runner), str(cand), str(prob), repr(init), repr(sizes)],
                          env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.parametrize("case", ["gemm_groupnorm", "softmax_dim0", "batchnorm", "embedding"])
def test_triton_candidates_match_at_two_sizes(case: str, tmp_path: Path):
    if case == "gemm_groupnorm":
        src = problem(LINEAR + "\nself.gn = nn.GroupNorm(4, args[1])", "return F.gelu(self.gn(self.linear(x)))",
                      "[torch.randn(8, 32)]", "[32, 64]")
        _run_triton(src, tmp_path, [(8, 32), (13, 32)], [32, 64])
    elif case == "softmax_dim0":
        src = problem("", "return torch.softmax(x * 2.0, dim=0) + x.mean(dim=1, keepdim=True)", "[torch.randn(8, 32)]")
        _run_triton(src, tmp_path, [(8, 32), (19, 7)], [])
    elif case == "embedding":  # a decoder's first op: each id's row, gathered, its norm fused after it
        src = problem("self.emb = nn.Embedding(args[0], args[1])\nself.norm = nn.LayerNorm(args[1])",
                      "return self.norm(self.emb(x)) * 2.0", "[torch.randint(0, 50, (4, 6))]", "[50, 24]")
        _run_triton(src, tmp_path, ["torch.randint(0, 50, (4, 6))", "torch.randint(0, 50, (3, 11))"], [50, 24])
    else:
        src = problem("self.bn = nn.BatchNorm1d(args[0])", "return torch.tanh(self.bn(x))", "[torch.randn(8, 16)]", "[16]")
        _run_triton(src, tmp_path, [(8, 16), (30, 16)], [16])
        assert isinstance(plan_problem(src).kernels[-1], RowKernel | PointwiseKernel)


def test_init_inputs_baked_into_kernels_are_refused_when_different(tmp_path: Path):
    """A pooling window from the init inputs is a loop extent the trace pins to its value: the
    candidate is built for it and says so, instead of pooling wrong windows for another one.
    (A group count stays a symbol: tests/test_expert_rewrites.py.)"""
    from kforge.agents.expert.codegen.backend import render_default

    src = problem("self.pool = nn.MaxPool1d(args[0], 2)", "return self.pool(x)",
                  "[torch.randn(4, 32, 12)]", "[8, 32]")
    prog = plan_problem(src)
    assert prog.fixed_init == {0: 8}
    path = tmp_path / "cand_gn.py"
    path.write_text(render_default(prog, "triton", "strict", src))
    import importlib.util

    spec = importlib.util.spec_from_file_location("cand_gn", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.ModelNew(8, 32)  # the traced value: fine
    with pytest.raises(ValueError, match=r"compiled for args\[0\] = 8, got 4"):
        mod.ModelNew(4, 32)


def test_in_place_ops_on_computed_tensors_become_new_values(tmp_path: Path):
    # nn.ReLU(inplace=True) and tensor.add_ / mul_ / sigmoid_ on what the forward computed:
    # every later use sees the update, as in eager PyTorch; all of it fuses into the GEMM
    src = problem(LINEAR + "\nself.act = nn.ReLU(inplace=True)",
                  "x = self.act(self.linear(x))\ny = x * 2.0\nx.add_(1.0)\nx.mul_(y)\nreturn torch.sigmoid_(x) + y",
                  "[torch.randn(8, 32)]", "[32, 24]")
    assert kinds(src) == ["gemm"]
    _run_triton(src, tmp_path, [(8, 32), (13, 32)], [32, 24])


@pytest.mark.parametrize("init,forward,match", [
    # the view read after its base was updated in place
    (LINEAR, "x = self.linear(x)\ny = x.view(-1)\nx.add_(1.0)\nreturn y * 2.0", "shares storage"),
    # the base read after the update through its view
    (LINEAR, "x = self.linear(x)\ny = x.view(-1)\ny.relu_()\nreturn x * 2.0", "shares storage"),
    # a second view of the same base, read after the update through the first one
    (LINEAR, "x = self.linear(x)\na = x.view(-1)\nb = x.t()\na.mul_(3.0)\nreturn b + 1.0", "shares storage"),
    # an input, and a view of one
    ("", "x.relu_()\nreturn x * 2.0", "in-place"),
    ("", "y = x.view(-1)\ny.relu_()\nreturn y * 2.0", "in-place"),
])
def test_in_place_ops_that_would_show_through_a_view_or_on_an_input_are_refused(init: str, forward: str, match: str):
    with pytest.raises(UnsupportedError, match=match):
        plan_problem(problem(init, forward, "[torch.randn(8, 32)]", "[32, 24]" if init else "[]"))


def test_in_place_ops_on_a_view_nobody_reads_afterwards_and_copy_into_a_computed_tensor(tmp_path: Path):
    # EfficientNet / MobileNet: nn.ReLU6(inplace=True) decomposes into t.copy_(clamp(t)), and an
    # in-place ReLU on a conv output (a view of the GEMM result, which nothing reads after it)
    src = problem(LINEAR + "\nself.act = nn.ReLU6(inplace=True)",
                  "y = self.linear(x).view(-1, 4, 6)\nF.relu(y, inplace=True)\nz = self.act(y + 0.5)\n"
                  "return z.flatten(1) + y.sum(dim=2).repeat(1, 6)",
                  "[torch.randn(8, 32)]", "[32, 24]")
    _run_triton(src, tmp_path, [(8, 32), (13, 32)], [32, 24])


def test_split_and_chunk_pieces_are_slices(tmp_path: Path):
    # x.chunk / torch.split (an LSTM's gates): each piece a slice of the GEMM's output
    src = problem("self.linear = nn.Linear(args[0], 3 * args[1])",
                  "q, k, v = self.linear(x).chunk(3, dim=1)\ni, f = torch.split(v, v.size(1) // 2, dim=1)\n"
                  "return torch.sigmoid(q) * torch.tanh(k) + torch.cat([f, i], dim=1)",
                  "[torch.randn(8, 32)]", "[32, 16]")
    assert "gemm" in kinds(src)
    _run_triton(src, tmp_path, [(8, 32), (13, 32)], [32, 16])


def test_cumprod_carries_its_prefix_across_chunks(tmp_path: Path):
    # rows longer than one BLOCK_S chunk: each chunk continues from the prefix product stored
    # at the end of the last one
    src = problem("", "return torch.cumprod(1.0 + 0.01 * x, dim=1)", "[torch.randn(3, 1500)]")
    assert kinds(src) == ["scan"]
    _run_triton(src, tmp_path, [(3, 1500), (2, 2100)], [])


HELPERS = HEAD + '''def scaled_gelu(t):
    return F.gelu(t) * 0.5


class Block(nn.Module):
    def __init__(self, a, b):
        super(Block, self).__init__()
        self.linear = nn.Linear(a, b)

    def forward(self, x):
        return torch.relu(self.linear(x))


def make_blocks(a, b):
    return nn.Sequential(Block(a, b), Block(b, b))


class Model(nn.Module):
    def __init__(self, a, b):
        super(Model, self).__init__()
        self.blocks = self._make_layer(a, b)

    def _make_layer(self, a, b):
        return make_blocks(a, b)

    def forward(self, x):
        return scaled_gelu(self.blocks(x))


def get_inputs():
    return [torch.randn(8, 32)]


def get_init_inputs():
    return [32, 24]
'''


def test_the_modules_and_helpers_init_builds_with_come_along(tmp_path: Path):
    # KernelBench's CNNs (ResNet's BasicBlock, EfficientNet's _make_mbconv_block): ModelNew's
    # copy of __init__ needs the classes and functions it reaches; their forward methods and
    # what only forward uses stay behind (the kernels compute)
    from kforge.agents.expert.codegen.candidate import reference_support
    from kforge.verifier.checks import static_check

    support, methods = reference_support(HELPERS)
    assert "class Block(nn.Module)" in support and "def make_blocks" in support
    assert "def forward" not in support and "scaled_gelu" not in support
    assert "def _make_layer(self, a, b)" in methods
    _run_triton(HELPERS, tmp_path, [(8, 32), (5, 32)], [32, 24])
    from kforge.agents.expert.codegen.backend import render_default
    prog = plan_problem(HELPERS)
    assert static_check(render_default(prog, "triton", "strict", HELPERS), HELPERS,
                        platform="triton") == []


@pytest.mark.parametrize("forward", [
    "return x.to(torch.float32)",  # a no-op cast: the output is the input itself
    "h = x.to(torch.float32)\nv = h.pow(2).mean(-1, keepdim=True)\nreturn h * torch.rsqrt(v + 1e-6), x",
], ids=["cast_alias", "rmsnorm_and_input"])
def test_a_returned_input_is_copied_and_verifies(forward: str, tmp_path: Path) -> None:
    """A model region that returns its input (an RMSNorm's no-op ``to(float32)`` in a
    transformers decoder) gets a copy kernel; planning it once crashed the renderer (the
    input's name was read after the copy had rebound it)."""
    from tests.test_expert_coverage import _verify

    path = tmp_path / "alias.py"
    path.write_text(problem("", forward, "[torch.randn(8, 16)]"))
    prog = plan_problem(path.read_text())
    assert prog.inputs == ["x"] and all(prog.buffers[o].kind != "input" for o in prog.outputs)
    _verify(path, "cpu", tmp_path)
