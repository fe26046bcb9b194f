"""Emit a CPU candidate module (``CPP_SOURCE`` + ``ModelNew``) from the IR and a plan.

The module follows ``refs/cpu``: C++ in a plain string constant, built and loaded by
:mod:`kforge.platforms.cpu_runtime`, called through ctypes on contiguous fp32 tensors.
``ModelNew.__init__`` is the reference ``Model.__init__`` body (copied from its source), so
parameters have the same names, order and seeded initial values; ``forward`` only allocates
outputs and launches our kernels. Output is deterministic for a given (IR, plan, source).
"""

from __future__ import annotations

import ast
import textwrap

from kforge.agents.expert.cpu_chain import TensorArg
from kforge.agents.expert.cpu_gemm import gemm_kernel
from kforge.agents.expert.cpu_math import PRELUDE
from kforge.agents.expert.cpu_rows import elementwise_kernel, reduction_kernel
from kforge.agents.expert.graph import (
    ElementwisePattern,
    GemmPattern,
    KernelGraph,
    RowReductionPattern,
    UnsupportedError,
)
from kforge.agents.expert.plans import CpuPlan

HEADER = '"""KForge expert candidate for the cpu platform (generated; plan: {plan})."""\n'


def reference_init(problem_source: str) -> tuple[list[str], str]:
    """The problem's import lines and the source of ``Model.__init__`` (``def`` included)."""
    tree = ast.parse(problem_source)
    imports = [ast.get_source_segment(problem_source, n) or "" for n in tree.body
               if isinstance(n, ast.Import | ast.ImportFrom)]
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    seg = ast.get_source_segment(problem_source, item, padded=True) or ""
                    return imports, textwrap.dedent(seg)
    return imports, "def __init__(self, *args, **kwargs):\n    super().__init__()\n"


def _ident(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)


def _tensor_expr(kind: str, name: str) -> str:
    """Python expression for a forward() input or a parameter of ``self`` (contiguous)."""
    if kind == "input":
        return f"cpu_runtime.as_input({name})"
    parts = name.split(".")
    if all(p.isidentifier() for p in parts):
        return f"cpu_runtime.as_input(self.{name})"
    owner, _, leaf = name.rpartition(".")
    return f"cpu_runtime.as_input(getattr(self.get_submodule({owner!r}), {leaf!r}))"


def _bind(tensors: list[TensorArg], lines: list[str]) -> list[str]:
    names = []
    for t in tensors:
        var = f"_{t.cname}"
        lines.append(f"{var} = {_tensor_expr(t.kind, t.name)}")
        names.append(f"{var}.data_ptr()")
    return names


def _launch(entry: str, args: list[str]) -> str:
    return f"cpu_runtime.launch(_K[{entry!r}], {entry!r}, {', '.join(args)})"


def _epilogue_lines(graph: KernelGraph, plan: CpuPlan, out: str, kernels: dict[str, str],
                    lines: list[str], rows: str, cols: str) -> None:
    """Unfused epilogue: a second kernel over the output, in place."""
    ops = graph.chain()
    if not ops or plan.fuse_epilogue:
        return
    result = graph.pattern.result
    code, tensors = elementwise_kernel("kf_epilogue", ops, result, plan, core_ptr=True)
    kernels["kf_epilogue"] = code
    ptrs = _bind(tensors, lines)
    lines.append(_launch("kf_epilogue", [*ptrs, f"{out}.data_ptr()", f"{out}.data_ptr()", rows,
                                         cols, "_threads"]))


def generate_cpu_candidate(graph: KernelGraph, plan: CpuPlan, problem_source: str) -> str:
    """The candidate module's source for ``graph`` under ``plan``."""
    kernels: dict[str, str] = {}
    lines: list[str] = []
    pat = graph.pattern
    if isinstance(pat, ElementwisePattern):
        code, tensors = elementwise_kernel("kf_elementwise", pat.ops, pat.result, plan, core_ptr=False)
        kernels["kf_elementwise"] = code
        ptrs = _bind(tensors, lines)
        shapes = ", ".join(f"_{t.cname}.shape" for t in tensors)
        lines.append(f"_shape = torch.broadcast_shapes({shapes})")
        lines.append("out = torch.empty(_shape, dtype=torch.float32)")
        lines.append("_cols = _shape[-1] if len(_shape) else 1")
        lines.append("_rows = out.numel() // _cols if _cols else 0")
        lines.append(_launch("kf_elementwise", [*ptrs, "out.data_ptr()", "_rows", "_cols", "_threads"]))
    elif isinstance(pat, RowReductionPattern):
        code, tensors, norm = reduction_kernel("kf_reduce", pat, plan)
        kernels["kf_reduce"] = code
        lines.append(f"x = cpu_runtime.as_input({pat.input})")
        norm_ptrs = _bind([TensorArg("param", n, f"n{i}") for i, n in enumerate(norm)], lines)
        ptrs = _bind(tensors, lines)
        lines.append("_cols = x.shape[-1]")
        lines.append("_rows = x.numel() // _cols if _cols else 0")
        if pat.keeps_row:
            lines.append("out = torch.empty_like(x)")
        else:
            tail = " + (1,)" if pat.keepdim else ""
            lines.append(f"out = torch.empty(tuple(x.shape[:-1]){tail}, dtype=torch.float32)")
        lines.append("_ocols = out.shape[-1] if out.dim() else 1")
        lines.append(_launch("kf_reduce", ["x.data_ptr()", *norm_ptrs, *ptrs, "out.data_ptr()",
                                           "_rows", "_cols", "_ocols", "_threads"]))
        ocols = "_cols" if pat.keeps_row else "_ocols"
        orows = "_rows" if pat.keeps_row else "(out.numel() // _ocols if _ocols else 0)"
        _epilogue_lines(graph, plan, "out", kernels, lines, orows, ocols)
    elif isinstance(pat, GemmPattern):
        code, tensors = gemm_kernel(pat, plan)
        kernels["kf_gemm"] = code
        lines.append(f"a = {_tensor_expr('input', pat.a)}")
        lines.append(f"b = {_tensor_expr(pat.b_role, pat.b)}")
        ptrs = ["a.data_ptr()", "b.data_ptr()"]
        if pat.bias:
            lines.append(f"bias = {_tensor_expr(pat.bias_role, pat.bias)}")
            ptrs.append("bias.data_ptr()")
        ptrs += _bind(tensors, lines)
        n_expr = "b.shape[0]" if pat.b_layout == "nk" else "b.shape[1]"
        lines.append("_k = a.shape[-1]")
        lines.append(f"_n = {n_expr}")
        lines.append("_m = a.numel() // _k if _k else 0")
        lines.append("out = torch.empty(tuple(a.shape[:-1]) + (_n,), dtype=torch.float32)")
        lines.append(_launch("kf_gemm", [*ptrs, "out.data_ptr()", "_m", "_n", "_k", "_threads"]))
        _epilogue_lines(graph, plan, "out", kernels, lines, "_m", "_n")
    else:  # pragma: no cover - the IR union is closed
        raise UnsupportedError(f"pattern {type(pat).__name__}")
    return _module(graph, plan, problem_source, kernels, lines)


def _signature(code: str) -> str:
    """ctypes signature letters from an ``extern "C"`` definition's parameter list."""
    params = code[code.index("(", code.index('extern "C"')) + 1 : code.index(")", code.index('extern "C"'))]
    return "".join("p" if "*" in p else "i" for p in params.split(","))


def _module(graph: KernelGraph, plan: CpuPlan, problem_source: str, kernels: dict[str, str],
            lines: list[str]) -> str:
    imports, init = reference_init(problem_source)
    cpp = PRELUDE + "#include <vector>\n#include <algorithm>\n" + "\n".join(kernels.values())
    if '"""' in cpp:
        raise UnsupportedError("generated C++ contains a triple quote")
    entries = "\n".join(
        f"_K[{name!r}] = cpu_runtime.entry(_LIB, {name!r}, {_signature(code)!r})"
        for name, code in kernels.items()
    )
    args = ", ".join(_ident(t.name) for t in graph.inputs)
    body = "\n".join(f"        {line}" for line in lines)
    knobs = ", ".join(f"{k}={v}" for k, v in plan.knobs().items())
    std_imports = ["import torch", "import torch.nn as nn", "import torch.nn.functional as F"]
    all_imports = list(dict.fromkeys([*std_imports, *imports]))
    return (
        HEADER.format(plan=knobs)
        + "\n".join(all_imports)
        + "\n\nfrom kforge.platforms import cpu_runtime\n\n"
        + f'CPP_SOURCE = r"""{cpp}"""\n\n'
        + "_LIB = cpu_runtime.load_library(CPP_SOURCE)\n_K = {}\n"
        + entries
        + "\n\n\nclass ModelNew(nn.Module):\n"
        + textwrap.indent(init.rstrip() + "\n", "    ")
        + f"\n    def forward(self, {args}):\n"
        + "        _threads = cpu_runtime.threads()\n"
        + body
        + "\n        return out\n"
    )


