"""The expert agent's CUDA C++ code generator: a :class:`KernelGraph` and a plan -> candidate.

The candidate follows refs/cuda/: ``CUDA_SOURCE`` is a standalone translation unit (kernels +
host launchers on raw pointers, run-time sizes and a ``cudaStream_t``; no torch header, so
``nvcc -arch=sm_90 -c`` checks it on any host), ``CPP_SOURCE`` holds one torch wrapper
``kf_forward`` (device/dtype/size checks, ``.contiguous()``, ``torch::empty`` output on the
input's device, launch on PyTorch's current stream, launch errors raised) and ``FUNCTIONS``
names it; :func:`kforge.platforms.cuda_runtime.load_extension` builds it at import. Kernels:
:mod:`~kforge.agents.expert.cuda_kernels` (elementwise, row reductions) and
:mod:`~kforge.agents.expert.cuda_gemm`; pointwise chains: :mod:`~kforge.agents.expert.cuda_pointwise`.

Plan keys (missing keys take :func:`default_cuda_plan`'s values; unknown keys are ignored)::

    elementwise     block_size vector_width fast_math
    row_reduction   block_size vector_width online_softmax (softmax, log_softmax) fast_math
    gemm            block_m block_n block_k thread_m thread_n warp_m warp_n precision fast_math

``precision`` is ``fp32`` (SIMT FMA; strict) or ``tf32`` (wmma tensor cores, fp32
accumulate; relaxed only); ``thread_m/n`` shape the fp32 micro-tile, ``warp_m/n`` the tf32
warp tile. ``fast_math`` 1 builds with ``--use_fast_math`` (relaxed only); otherwise the
extension is built with ``-O3`` alone (the runtime's default adds fast math, which strict
must not have). A plan outside these rules is a :class:`PlanError`.

``ModelNew.__init__`` is the reference's ``__init__`` when the problem source is given (same
constructor arguments, same modules, same seeded parameters: ``self.linear`` only holds
parameters and is never called); without it, parameters are registered under the reference's
``state_dict`` names. ``forward`` calls only ``_ext.kf_forward``.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

from kforge.agents.expert.cuda_gemm import SMEM_LIMIT, gemm_parts, smem_bytes, threads
from kforge.agents.expert.cuda_kernels import CudaParts, elementwise_parts, row_reduction_parts
from kforge.agents.expert.cuda_pointwise import CUDA_PRELUDE
from kforge.agents.expert.errors import PlanError, UnsupportedError
from kforge.agents.expert.graph import KernelGraph
from kforge.agents.expert.triton_codegen import module_helpers

PRECISIONS = {"strict": ("fp32",), "relaxed": ("fp32", "tf32")}
POW2_KEYS = (
    "block_size",
    "block_m",
    "block_n",
    "block_k",
    "thread_m",
    "thread_n",
    "warp_m",
    "warp_n",
)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (max(n, 1) - 1).bit_length())


def default_cuda_plan(graph: KernelGraph, policy: str = "strict") -> dict[str, Any]:
    """Sensible first-round knobs for an H100/H200-class GPU."""
    pattern = graph.pattern
    if pattern.kind == "gemm":
        if policy == "relaxed":
            return {
                "block_m": 128,
                "block_n": 128,
                "block_k": 32,
                "thread_m": 8,
                "thread_n": 8,
                "warp_m": 64,
                "warp_n": 32,
                "precision": "tf32",
                "fast_math": 0,
            }
        return {
            "block_m": 128,
            "block_n": 128,
            "block_k": 16,
            "thread_m": 8,
            "thread_n": 8,
            "warp_m": 64,
            "warp_n": 32,
            "precision": "fp32",
            "fast_math": 0,
        }
    if pattern.kind == "row_reduction":
        # ~16 columns a thread, 32..1024 threads.
        block = min(1024, max(32, _next_pow2(-(-pattern.cols // 16))))
        plan: dict[str, Any] = {"block_size": block, "vector_width": 4, "fast_math": 0}
        if pattern.op in ("softmax", "log_softmax"):
            plan["online_softmax"] = 1
        return plan
    return {"block_size": 256, "vector_width": 4, "fast_math": 0}


def _check_gemm(knobs: dict[str, Any], b_layout: str) -> None:
    bm, bn, bk = knobs["block_m"], knobs["block_n"], knobs["block_k"]
    if min(bm, bn) < 16 or max(bm, bn) > 256 or bk > 128:
        raise PlanError(
            f"block_m/block_n must lie in 16..256 and block_k <= 128, got {bm}x{bn}x{bk}"
        )
    if knobs["precision"] == "tf32":
        wm, wn = knobs["warp_m"], knobs["warp_n"]
        if bk < 8 or wm < 16 or wn < 16 or wm > bm or wn > bn or (wm // 16) * (wn // 16) > 16:
            raise PlanError(
                f"tf32 needs block_k >= 8 and 16 <= warp tile <= block tile with at most 16 "
                f"fragments a warp, got block {bm}x{bn}x{bk}, warp {wm}x{wn}"
            )
    else:
        tm, tn = knobs["thread_m"], knobs["thread_n"]
        if tm > 16 or tn > 16 or tm * tn > 128 or tm > bm or tn > bn:
            raise PlanError(
                f"micro-tile thread_m x thread_n must be <= 16 each, <= 128 in all, got {tm}x{tn}"
            )
    nt = threads(knobs)
    if not 32 <= nt <= 1024:
        raise PlanError(f"the GEMM tile needs {nt} threads a block; it must be 32..1024")
    smem = smem_bytes(knobs, b_layout)
    if smem > SMEM_LIMIT:
        raise PlanError(f"the GEMM tile needs {smem} bytes of shared memory (limit {SMEM_LIMIT})")


def resolve_cuda_plan(graph: KernelGraph, plan: dict[str, Any], policy: str) -> dict[str, Any]:
    """``default_cuda_plan`` overlaid with ``plan``'s known keys, checked (policy included)."""
    if policy not in PRECISIONS:
        raise PlanError(f"unknown precision policy {policy!r}: 'strict' or 'relaxed'")
    base = default_cuda_plan(graph, policy)
    knobs = {**base, **{k: v for k, v in plan.items() if k in base}}
    for key, value in knobs.items():
        if key == "precision":
            if value not in PRECISIONS[policy]:
                raise PlanError(
                    f"precision {value!r} is not allowed under the {policy} policy "
                    f"(allowed: {', '.join(PRECISIONS[policy])})"
                )
        elif key in ("online_softmax", "fast_math"):
            if value not in (0, 1) or isinstance(value, float):
                raise PlanError(f"plan key {key} must be 0 or 1, got {value!r}")
        elif key == "vector_width":
            if value not in (1, 4) or isinstance(value, bool | float):
                raise PlanError(f"plan key vector_width must be 1 or 4, got {value!r}")
        elif not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise PlanError(f"plan key {key} must be a positive integer, got {value!r}")
        elif key in POW2_KEYS and value & (value - 1):
            raise PlanError(f"plan key {key} must be a power of two, got {value}")
    if knobs["fast_math"] and policy == "strict":
        raise PlanError("fast_math is not allowed under the strict policy (inexact expf/division)")
    if "block_size" in knobs and not 32 <= knobs["block_size"] <= 1024:
        raise PlanError(f"plan key block_size must be 32..1024, got {knobs['block_size']}")
    pattern = graph.pattern
    if pattern.kind == "gemm":
        _check_gemm(knobs, pattern.b_layout)
    return knobs


# --------------------------------------------------------------------------- assembly

CPP_PRELUDE = r"""#include <torch/extension.h>
#include <ATen/ExpandUtils.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <vector>

static torch::Tensor kf_prep(const torch::Tensor& t, const char* name, const torch::Device& dev) {
    TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
    TORCH_CHECK(t.device() == dev, name, " must be on ", dev, ", got ", t.device());
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, " must be float32, got ", t.scalar_type());
    return t.contiguous();
}

static void kf_check_numel(const torch::Tensor& t, int64_t expected, const char* name) {
    TORCH_CHECK(t.numel() == expected, name, " has ", t.numel(), " elements, expected ", expected);
}

static void kf_check_launch(cudaError_t err, const char* kernel) {
    TORCH_CHECK(err == cudaSuccess, kernel, " failed: ", cudaGetErrorString(err));
}
"""


def used_tensors(graph: KernelGraph) -> list[str]:
    """Tensors the kernels read, forward inputs first then parameters (graph order)."""
    pattern = graph.pattern
    names: set[str] = {
        a.name for op in graph.chain() for a in op.args if a.kind in ("input", "param")
    }
    if pattern.result.kind in ("input", "param"):
        names.add(pattern.result.name)
    if pattern.kind == "row_reduction":
        names.update(n for n in (pattern.input, pattern.weight, pattern.bias) if n)
    elif pattern.kind == "gemm":
        names.update(n for n in (pattern.a, pattern.b, pattern.bias) if n)
    return [t.name for t in (*graph.inputs, *graph.params) if t.name in names]


def _wrapper(graph: KernelGraph, parts: CudaParts, names: list[str]) -> str:
    args = ", ".join(f"torch::Tensor a{i}" for i in range(len(names)))
    lines = [
        f"torch::Tensor kf_forward({args}) {{",
        f'    TORCH_CHECK(a0.is_cuda(), "{names[0]} must be a CUDA tensor");',
        "    const c10::cuda::OptionalCUDAGuard kf_guard(a0.device());",
    ]
    lines += [
        f'    const torch::Tensor c{i} = kf_prep(a{i}, "{n}", a0.device());'
        for i, n in enumerate(names)
    ]
    return "\n".join(lines) + "\n" + parts.wrapper + "    return out;\n}\n"


def _py_tensor(graph: KernelGraph, name: str) -> str:
    if any(t.name == name for t in graph.inputs):
        return name
    if all(part.isidentifier() for part in name.split(".")):
        return f"self.{name}"
    return f"_state(self, {name!r})"


def _param_setup(graph: KernelGraph) -> list[str]:
    """``__init__`` lines registering parameters under their state_dict names (no source)."""
    lines: list[str] = []
    done: set[str] = set()
    pattern = graph.pattern
    if pattern.kind == "gemm" and pattern.b_role == "param" and pattern.b.endswith(".weight"):
        prefix = pattern.b[: -len(".weight")]
        has_bias = pattern.bias == f"{prefix}.bias"
        if prefix.isidentifier() and pattern.b_layout == "nk":
            lines.append(
                f"        self.{prefix} = nn.Linear({pattern.k}, {pattern.n}, bias={has_bias})"
            )
            done.update({pattern.b, f"{prefix}.bias"} if has_bias else {pattern.b})
    lines += [
        f"        _register(self, {p.name!r}, {list(p.shape)!r})"
        for p in graph.params
        if p.name not in done
    ]
    return lines or ["        pass"]


def generate_cuda(
    graph: KernelGraph, plan: dict[str, Any], policy: str, problem_source: str | None = None
) -> str:
    """A complete ``cuda`` candidate module for ``graph`` under ``plan`` and ``policy``.

    Raises :class:`PlanError` for a plan outside the rules or the policy and
    :class:`~kforge.agents.expert.graph.UnsupportedError` for IR it cannot express."""
    knobs = resolve_cuda_plan(graph, plan, policy)
    names = used_tensors(graph)
    if not names:
        raise UnsupportedError("a pattern that reads no tensor")
    cvars = {n: f"c{i}" for i, n in enumerate(names)}
    kind = graph.pattern.kind
    if kind == "gemm":
        parts = gemm_parts(graph, knobs, cvars)
    elif kind == "row_reduction":
        parts = row_reduction_parts(graph, knobs, cvars)
    elif kind == "elementwise":
        parts = elementwise_parts(graph, knobs, cvars)
    else:  # pragma: no cover - the IR is a closed union
        raise UnsupportedError(f"pattern {kind!r}")
    cuda = CUDA_PRELUDE + parts.cuda
    cpp = CPP_PRELUDE + "\n" + parts.decl + "\n\n" + _wrapper(graph, parts, names)
    if '"""' in cuda + cpp:
        raise UnsupportedError("generated C++ contains a triple quote")
    flags = ["-O3", "--use_fast_math"] if knobs["fast_math"] else ["-O3"]
    knob_text = ", ".join(f"{k}={v}" for k, v in knobs.items())
    imports = ["import torch", "import torch.nn as nn"]
    if problem_source is not None:
        from kforge.agents.expert.codegen.candidate import reference_init

        extra, init = reference_init(problem_source)
        imports = list(dict.fromkeys([*imports, *extra]))
        init_lines = textwrap.indent(init.rstrip(), "    ").split("\n")
        helpers = "\n\n" + module_helpers(register=False) + "\n"
    else:
        init_lines = [
            "    def __init__(self, *args, **kwargs):",
            "        super().__init__()",
            *_param_setup(graph),
        ]
        helpers = "\n\n" + module_helpers(register=True)
    inputs = ", ".join(t.name for t in graph.inputs)
    call = ", ".join(_py_tensor(graph, n) for n in names)
    return (
        f'"""Generated by the KForge expert agent (CUDA C++): {parts.summary}; policy {policy}; '
        f'{knob_text}."""\n\n'
        + "\n".join(imports)
        + "\n\nfrom kforge.platforms.cuda_runtime import load_extension\n\n"
        + f'CUDA_SOURCE = r"""{cuda}"""\n\n'
        + f'CPP_SOURCE = r"""{cpp}"""\n\n'
        + 'FUNCTIONS = ["kf_forward"]\n'
        + f"CUDA_FLAGS = {flags!r}\n\n"
        + "_ext = load_extension(CUDA_SOURCE, CPP_SOURCE, FUNCTIONS, extra_cuda_cflags=CUDA_FLAGS)\n"
        + helpers
        + "\n\nclass ModelNew(nn.Module):\n"
        + "\n".join(init_lines)
        + f"\n\n    def forward(self, {inputs}):\n"
        + f"        return _ext.kf_forward({call})\n"
    )


def kernel_names(source: str) -> list[str]:
    """``__global__`` kernel names in a generated module (for profiles and tests)."""
    return re.findall(r"__global__ void __launch_bounds__\([^)]*\) (\w+)\(", source)
