"""The expert agent's Triton code generator: a :class:`KernelGraph` and a plan -> candidate source.

One kernel per pattern, shape-generic (sizes are runtime arguments, every access masked)::

    elementwise     1-D grid over the output, BLOCK elements a program, the whole chain fused
    row_reduction   one program per row; the row in one tile when it fits (BLOCK_N >= cols),
                    else a chunked loop (online max/sum for softmax); epilogue fused
    gemm            BLOCK_M x BLOCK_N tiles, GROUP_M-swizzled program order, K loop of
                    ``tl.dot`` with an fp32 accumulator, bias + epilogue on the tile, one store

Plan keys (missing keys take :func:`default_plan`'s values)::

    gemm            BLOCK_M BLOCK_N BLOCK_K GROUP_M num_warps num_stages precision precast
    elementwise     BLOCK num_warps
    row_reduction   BLOCK_N num_warps

``precision`` is ``ieee`` | ``tf32x3`` (strict: fp32-faithful) or also ``tf32`` | ``bf16`` |
``bf16x3`` (relaxed); ``precast`` converts bf16 operands once per call in a separate kernel
(see :mod:`kforge.agents.expert.triton_gemm`). A precision the policy does not allow is a
:class:`PlanError`. The candidate's ``ModelNew`` registers every parameter under the
reference's ``state_dict`` name, so ``load_state_dict(reference.state_dict())`` fits it;
When the problem source is given, ``ModelNew.__init__`` *is* the reference's ``__init__``
(the expert's convention, shared with the cpu generator), so KernelBench's seeded
construction gives identical parameters; ``forward`` only launches the generated kernels.
Without it, parameters are registered under the reference's ``state_dict`` names (so
``load_state_dict(reference.state_dict())`` fits) and ``nn.Linear``-shaped ones are created by
``nn.Linear`` so that seeded construction matches for linear layers too.
"""

from __future__ import annotations

import textwrap
from typing import Any

from kforge.agents.expert.codegen.triton.gemm import (  # one precision table for both generators
    RELAXED_PRECISIONS,
    SMEM_LIMIT,
    STRICT_PRECISIONS,
    allowed_precisions,
)
from kforge.agents.expert.codegen.triton.gemm import fit_shared_memory as fit_gemm_smem
from kforge.agents.expert.errors import PlanError, UnsupportedError
from kforge.agents.expert.graph import KernelGraph
from kforge.agents.expert.triton_gemm import gemm_source
from kforge.agents.expert.triton_kernels import elementwise_source, row_reduction_source

__all__ = ["RELAXED_PRECISIONS", "SMEM_LIMIT", "STRICT_PRECISIONS", "PlanError", "allowed_precisions"]


def _next_pow2(n: int) -> int:
    return 1 << max(0, (max(n, 1) - 1).bit_length())


def default_plan(ir: KernelGraph, policy: str) -> dict[str, Any]:
    """Sensible first-round knobs for an H100/H200-class GPU."""
    pattern = ir.pattern
    if pattern.kind == "gemm":
        relaxed = policy == "relaxed"
        return {
            "BLOCK_M": 128,
            "BLOCK_N": 256 if relaxed else 128,
            "BLOCK_K": 64 if relaxed else 32,
            "GROUP_M": 8,
            "num_warps": 8,
            "num_stages": 3,
            "precision": "bf16" if relaxed else "tf32x3",
            "precast": 1 if relaxed else 0,
        }
    if pattern.kind == "row_reduction":
        block = min(_next_pow2(pattern.cols), 16384)
        return {"BLOCK_N": block, "num_warps": 16 if block >= 8192 else 8 if block >= 2048 else 4}
    return {"BLOCK": 2048, "num_warps": 8}


def resolve_plan(ir: KernelGraph, plan: dict[str, Any], policy: str) -> dict[str, Any]:
    """``default_plan`` overlaid with ``plan``'s known keys, checked against the policy."""
    base = default_plan(ir, policy)
    merged = {**base, **{k: v for k, v in plan.items() if k in base}}
    for key, value in merged.items():
        if key == "precision":
            if value not in allowed_precisions(policy):
                raise PlanError(
                    f"precision {value!r} is not allowed under the {policy} policy "
                    f"(allowed: {', '.join(allowed_precisions(policy))})"
                )
        elif key == "precast":
            if value not in (0, 1, True, False):
                raise PlanError(f"plan key precast must be 0 or 1, got {value!r}")
        elif not isinstance(value, int) or value <= 0:
            raise PlanError(f"plan key {key} must be a positive integer, got {value!r}")
        elif key != "GROUP_M" and key != "num_stages" and value & (value - 1):
            raise PlanError(f"plan key {key} must be a power of two, got {value}")
    if ir.pattern.kind == "gemm":
        merged = fit_shared_memory(merged)
    return merged


def gemm_smem_bytes(knobs: dict[str, Any]) -> int:
    """Shared memory the K-loop pipeline needs: stages x (A tile + B tile) x operand copies.
    (Matches Triton 3.6's report on the H200, e.g. 128x256x64 bf16x3 precast, 3 stages:
    294912 bytes.)"""
    precast = bool(knobs.get("precast")) and knobs["precision"] in ("bf16", "bf16x3")
    elt = 2 if precast else 4
    copies = 2 if precast and knobs["precision"] == "bf16x3" else 1
    per_stage = (knobs["BLOCK_M"] + knobs["BLOCK_N"]) * knobs["BLOCK_K"] * elt * copies
    return int(knobs["num_stages"]) * per_stage


def fit_shared_memory(knobs: dict[str, Any], limit: int = SMEM_LIMIT) -> dict[str, Any]:
    """The compiler's fitting loop with this generator's precast-aware byte count."""
    return fit_gemm_smem(knobs, limit, gemm_smem_bytes)


# --------------------------------------------------------------------------- ModelNew


def _param_setup(ir: KernelGraph) -> list[str]:
    """__init__ lines registering parameters under their state_dict names."""
    lines: list[str] = []
    names = [p.name for p in ir.params]
    done: set[str] = set()
    pattern = ir.pattern
    # nn.Linear-shaped weight (+ bias) of a GEMM: create it as nn.Linear (seeded init matches).
    if pattern.kind == "gemm" and pattern.b_role == "param" and pattern.b.endswith(".weight"):
        prefix = pattern.b[: -len(".weight")]
        bias = f"{prefix}.bias"
        has_bias = pattern.bias == bias
        if "." not in prefix and pattern.b_layout == "nk" and (has_bias or bias not in names):
            lines.append(
                f"        self.{prefix} = nn.Linear({pattern.k}, {pattern.n}, bias={has_bias})"
            )
            done.update({pattern.b, bias} if has_bias else {pattern.b})
    for info in ir.params:
        if info.name in done:
            continue
        lines.append(f"        _register(self, {info.name!r}, {list(info.shape)!r})")
    return lines or ["        pass"]


# Module-level helpers every generated candidate carries (Triton and CUDA alike): its weights
# are looked up (``_state``) or created (``_register``) under the reference's state_dict names.
STATE_HELPER = '''def _state(module: nn.Module, name: str) -> torch.Tensor:
    """A parameter, buffer or tensor attribute by its dotted state_dict name."""
    owner, _, leaf = name.rpartition(".")
    return getattr(module.get_submodule(owner) if owner else module, leaf)
'''

REGISTER_HELPER = '''def _register(module: nn.Module, name: str, shape: list) -> None:
    """A parameter under its reference state_dict name (``a.b.weight`` -> submodules a.b)."""
    *path, leaf = name.split(".")
    for part in path:
        if not hasattr(module, part):
            module.add_module(part, nn.Module())
        module = getattr(module, part)
    value = torch.ones(shape) if leaf == "weight" else torch.zeros(shape)
    module.register_parameter(leaf, nn.Parameter(value, requires_grad=False))
'''



def module_helpers(register: bool) -> str:
    """``_state`` and, when the candidate creates parameters itself, ``_register``."""
    return STATE_HELPER + ("\n\n" + REGISTER_HELPER if register else "")


_PRELUDE = '''\
"""Generated by the KForge expert agent (Triton): {summary}."""

import os

import torch
import torch.nn as nn
import triton
import triton.language as tl

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # CPU interpreter: correctness only


{helpers}'''


def _model_new(ir: KernelGraph, launcher: str, problem_source: str | None) -> tuple[list[str], str]:
    """(extra import lines, the ModelNew class source)."""
    args = ", ".join(t.name for t in ir.inputs)
    tensors = [t.name for t in ir.inputs]
    imports: list[str] = []
    if problem_source is not None:
        from kforge.agents.expert.codegen.candidate import reference_init

        imports, init = reference_init(problem_source)
        init_lines = textwrap.indent(init.rstrip(), "    ").split("\n")
    else:
        init_lines = [
            "    def __init__(self, *args, **kwargs):",
            "        super().__init__()",
            *_param_setup(ir),
        ]
    lines = [
        "",
        "",
        "class ModelNew(nn.Module):",
        *init_lines,
        "",
        f"    def forward(self, {args}):",
    ]
    call_args = []
    for name in [*tensors, *[p.name for p in ir.params]]:
        call_args.append(name if name in tensors else f"_state(self, {name!r})")
    lines.append(f"        return {launcher}({', '.join(call_args)})")
    known = {
        "import torch",
        "import torch.nn as nn",
        "import triton",
        "import triton.language as tl",
    }
    return [i for i in imports if i not in known], "\n".join(lines) + "\n"


def generate_triton(
    ir: KernelGraph, plan: dict[str, Any], policy: str, problem_source: str | None = None
) -> str:
    """A complete candidate module (Triton kernel, launcher, ``ModelNew``) for ``ir``.

    Raises :class:`PlanError` for a plan outside the policy and
    :class:`~kforge.agents.expert.graph.UnsupportedError` for IR it cannot express."""
    knobs = resolve_plan(ir, plan, policy)
    pattern = ir.pattern
    if pattern.kind == "gemm":
        body, summary = gemm_source(ir, knobs)
    elif pattern.kind == "row_reduction":
        body, summary = row_reduction_source(ir, knobs)
    elif pattern.kind == "elementwise":
        body, summary = elementwise_source(ir, knobs)
    else:  # pragma: no cover - the IR is a closed union
        raise UnsupportedError(f"pattern {pattern.kind!r}")
    knob_text = ", ".join(f"{k}={v}" for k, v in knobs.items())
    head = _PRELUDE.format(summary=f"{summary}; policy {policy}; {knob_text}", helpers=module_helpers(True) + "\n")
    imports, model_new = _model_new(ir, "launch", problem_source)
    extra = "".join(f"{line}\n" for line in imports)
    return head + extra + body + model_new


def safer_plan(ir: KernelGraph, plan: dict[str, Any], policy: str, reason: str) -> dict[str, Any]:
    """The plan for a repair round after ``reason`` (a verify/compile failure reason or log).

    Accuracy failures of lossy GEMM modes move to the hi/lo split (``bf16x3``, ~1e-5); shared
    memory or resource failures shrink the pipeline, then the tile; anything else returns to
    the defaults with the policy's most accurate fast mode."""
    knobs = resolve_plan(ir, plan, policy)
    text = reason.lower()
    if ir.pattern.kind == "gemm":
        if any(w in text for w in ("mismatch", "allclose", "tolerance", "rel")) and knobs[
            "precision"
        ] in ("tf32", "bf16"):
            return {**knobs, "precision": "bf16x3", "precast": 1, "BLOCK_N": 128, "BLOCK_K": 64}
        if any(w in text for w in ("outofresources", "out of resource", "shared memory")):
            if knobs["num_stages"] > 2:
                return {**knobs, "num_stages": knobs["num_stages"] - 1}
            return {**knobs, "BLOCK_N": max(32, knobs["BLOCK_N"] // 2)}
    return default_plan(ir, policy)
