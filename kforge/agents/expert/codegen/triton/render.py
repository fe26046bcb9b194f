"""The Triton backend: a :class:`~.kernels.Program` and knobs -> a candidate module.

One ``@triton.jit`` kernel per planned kernel, every size a runtime argument (``z0, z1...``,
computed by ``forward`` from the tensors' shapes), every access masked::

    pointwise  1-D grid of BLOCK elements; loop variables by div/mod of the flat offset
    row        BLOCK_O outer rows per program; each pass loops over the reduced space in
               BLOCK_R chunks into a [BLOCK_O, BLOCK_R] accumulator reduced at the pass end;
               outer stores, then one more loop for full stores
    scan       one program per outer row; BLOCK_S chunks, ``tl.cumsum`` / ``tl.cumprod`` plus
               the running carry
    gemm       :mod:`.triton_matmul`

Knobs are per kernel name (``{"k1": {"BLOCK_O": 4, "BLOCK_R": 1024, "num_warps": 8}}``);
:func:`default_knobs` picks them from the traced sizes.
"""

from __future__ import annotations

from typing import Any

import sympy

from kforge.agents.expert.codegen.candidate import (
    STATE_HELPER,
    model_new_source,
    py_expr,
    shape_guard,
)
from kforge.agents.expert.codegen.triton.expr import TL_DTYPES, TritonEmitter, literal
from kforge.agents.expert.codegen.triton.graph import GRAPH_HELPER, graphable, graphed_class
from kforge.agents.expert.plan.kernels import (
    GemmKernel,
    Kernel,
    PointwiseKernel,
    Program,
    RowKernel,
    ScanKernel,
)
from kforge.agents.expert.plan.lower import E, strides

IDENT = {"sum": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf"), "any": 0, "all": 1,
         "argmax": float("-inf"), "argmin": float("inf")}


def next_pow2(n: int) -> int:
    return 1 << max(0, (max(n, 1) - 1).bit_length())


class Args:
    """A kernel's parameters: buffer pointers and size expressions, in a stable order."""

    def __init__(self) -> None:
        self.buffers: list[str] = []
        self.sizes: dict[str, str] = {}  # sympy srepr -> arg name
        self.exprs: dict[str, Any] = {}

    def buffer(self, name: str) -> str:
        if name not in self.buffers:
            self.buffers.append(name)
        return name

    def size(self, expr: Any) -> str:
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return str(int(expr))
        key = sympy.srepr(expr)
        if key not in self.sizes:
            self.sizes[key] = f"z{len(self.sizes)}"
            self.exprs[key] = expr
        return self.sizes[key]

    def collect(self, *es: E) -> None:
        for root in es:
            for e in root.walk():
                if e.op == "load":
                    self.buffer(e.v)
                elif e.op == "size":
                    self.size(e.v)

    def params(self) -> str:
        return ", ".join([*self.buffers, *self.sizes.values()])

    def launch_args(self) -> str:
        vals = [py_expr(self.exprs[k]) for k in self.sizes]
        return ", ".join([*self.buffers, *vals])


def _resolver(args: Args, names: dict[str, str], accs: dict[str, str]) -> Any:
    def resolve(e: E) -> str | None:
        if e.op == "var":
            return names[e.v[0]]
        if e.op == "size":
            return args.size(e.v)
        if e.op == "acc":
            return accs[e.v]
        return None
    return resolve


def _unflatten(flat: str, shape: tuple[Any, ...], prefix: str, args: Args, indent: str) -> tuple[list[str], dict[str, str]]:
    lines, names = [], {}
    st = strides(shape)
    for d, s in enumerate(shape):
        name = f"{prefix}{d}"
        names[name] = name
        if sympy.sympify(s) == 1:
            lines.append(f"{indent}{name} = 0")
            continue
        q = f"({flat} // {args.size(st[d])})" if sympy.sympify(st[d]) != 1 else flat
        lines.append(f"{indent}{name} = {q}" if d == 0 else f"{indent}{name} = {q} % {args.size(s)}")
    return lines, names


def _numel(shape: tuple[Any, ...]) -> sympy.Expr:
    return sympy.Mul(*shape) if shape else sympy.Integer(1)


# --------------------------------------------------------------------------- pointwise

def pointwise_kernel(k: PointwiseKernel, knobs: dict[str, Any]) -> tuple[str, list[str]]:
    args = Args()
    for st in k.stores:
        args.collect(st.index, st.value)
        args.buffer(st.buffer)
    numel = args.size(_numel(k.space))
    head, names = _unflatten("offs", k.space, "p", args, "    ")
    emit = TritonEmitter(_resolver(args, names, {}), "mask")
    stores = [f"    tl.store({st.buffer} + {emit.index(st.index)}, {emit(st.value)}, mask=mask)" for st in k.stores]
    block = int(knobs.get("BLOCK", 1024))
    src = [
        "@triton.jit",
        f"def {k.name}({args.params()}, BLOCK: tl.constexpr):",
        "    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)",
        f"    mask = offs < {numel}",
        *head, *emit.lines, *stores,
    ]
    grid = f"(triton.cdiv({py_expr(_numel(k.space))}, {block}),)"
    launch = [f"{k.name}[{grid}]({args.launch_args()}, BLOCK={block}, num_warps={int(knobs.get('num_warps', 4))})"]
    return "\n".join(src), launch


# --------------------------------------------------------------------------- row

def _combine(kind: str, acc: str, v: str, mask: str, dt: str) -> list[str]:
    ident = literal(IDENT[kind], dt)
    masked = f"tl.where({mask}, {v}, {ident})"
    if kind == "sum":
        return [f"{acc} = {acc} + {masked}"]
    if kind == "prod":
        return [f"{acc} = {acc} * {masked}"]
    if kind in ("max", "any"):
        return [f"{acc} = tl.maximum({acc}, {masked})"]
    if kind in ("min", "all"):
        return [f"{acc} = tl.minimum({acc}, {masked})"]
    cmp = ">" if kind == "argmax" else "<"
    return [f"{acc}_u = ({v} {cmp} {acc}) & {mask}",
            f"{acc}_i = tl.where({acc}_u, rb, {acc}_i)",
            f"{acc} = tl.where({acc}_u, {v}, {acc})"]


def _finish(kind: str, acc: str, dt: str) -> str:
    if kind in ("sum",):
        return f"tl.sum({acc}, 1)[:, None]"
    if kind == "prod":
        return f"tl.reduce({acc}, 1, _mul_combine)[:, None]"
    if kind in ("max", "any"):
        return f"tl.max({acc}, 1)[:, None]"
    if kind in ("min", "all"):
        return f"tl.min({acc}, 1)[:, None]"
    best = "tl.max" if kind == "argmax" else "tl.min"
    return f"tl.min(tl.where({acc} == {best}({acc}, 1)[:, None], {acc}_i, 9223372036854775807), 1)[:, None]"


def row_kernel(k: RowKernel, knobs: dict[str, Any]) -> tuple[str, list[str]]:
    args = Args()
    for r in k.reductions:
        args.collect(r.body)
    for st in [*k.outer_stores, *k.full_stores]:
        args.collect(st.index, st.value)
        args.buffer(st.buffer)
    n_outer, n_red = args.size(_numel(k.outer)), args.size(_numel(k.red))
    o_lines, names = _unflatten("ob", k.outer, "o", args, "    ")
    r_lines, r_names = _unflatten("rb", k.red, "r", args, "        ")
    names.update(r_names)
    accs: dict[str, str] = {}
    lines = ["    ob = tl.program_id(0).to(tl.int64) * BLOCK_O + tl.arange(0, BLOCK_O)[:, None]",
             f"    omask = ob < {n_outer}", *o_lines]
    loop_head = [f"    for r_start in range(0, {n_red}, BLOCK_R):",
                 "        rb = r_start + tl.arange(0, BLOCK_R)[None, :]",
                 f"        mask = omask & (rb < {n_red})", *r_lines]
    for p in range(1, k.passes + 1):
        group = [r for r in k.reductions if r.pass_no == p]
        for r in group:
            dt = "f32" if r.kind in ("argmax", "argmin") else ("i32" if r.dt == "bool" else r.dt)
            init = literal(IDENT[r.kind], dt)
            lines.append(f"    {r.acc}_t = tl.full([BLOCK_O, BLOCK_R], {init}, {TL_DTYPES[dt if dt != 'bool' else 'i32']})")
            if r.kind in ("argmax", "argmin"):
                lines.append(f"    {r.acc}_t_i = tl.zeros([BLOCK_O, BLOCK_R], tl.int64)")
        lines += loop_head
        emit = TritonEmitter(_resolver(args, names, accs), "mask", "        ", prefix=f"p{p}_")
        body: list[str] = []
        for r in group:
            v = emit(r.body)
            if r.dt == "bool":
                v = f"({v}).to(tl.int32)"
            body += [f"        {line}" for line in _combine(r.kind, f"{r.acc}_t", v, "mask", "f32" if r.kind.startswith("arg") else r.dt)]
        lines += emit.lines + body
        for r in group:
            value = _finish(r.kind, f"{r.acc}_t", r.dt)
            if r.dt == "bool":
                value = f"({value} != 0)"
            lines.append(f"    {r.acc} = {value}")
            accs[r.acc] = r.acc
    emit = TritonEmitter(_resolver(args, names, accs), "omask", prefix="o_")
    stores = [f"    tl.store({st.buffer} + {emit.index(st.index)}, {emit(st.value)}, mask=omask)" for st in k.outer_stores]
    lines += emit.lines + stores
    if k.full_stores:
        lines += loop_head
        emit = TritonEmitter(_resolver(args, names, accs), "mask", "        ", prefix="f_")
        stores = [f"        tl.store({st.buffer} + {emit.index(st.index)}, {emit(st.value)}, mask=mask)" for st in k.full_stores]
        lines += emit.lines + stores
    src = ["@triton.jit", f"def {k.name}({args.params()}, BLOCK_O: tl.constexpr, BLOCK_R: tl.constexpr):", *lines]
    bo, br = int(knobs["BLOCK_O"]), int(knobs["BLOCK_R"])
    grid = f"(triton.cdiv({py_expr(_numel(k.outer))}, {bo}),)"
    launch = [f"{k.name}[{grid}]({args.launch_args()}, BLOCK_O={bo}, BLOCK_R={br}, num_warps={int(knobs.get('num_warps', 4))})"]
    return "\n".join(src), launch


# --------------------------------------------------------------------------- scan

def scan_kernel(k: ScanKernel, knobs: dict[str, Any]) -> tuple[str, list[str]]:
    args = Args()
    args.collect(k.body, k.store.index)
    args.buffer(k.store.buffer)
    n_len = args.size(k.length)
    o_lines, names = _unflatten("ob", k.outer, "o", args, "    ")
    names["s"] = "sb"
    emit = TritonEmitter(_resolver(args, names, {"scan": "c"}), "mask", "        ")
    v = emit(k.body)
    idx = emit.index(k.store.index)
    ident = "1.0" if k.op == "prod" else "0.0"
    # the carry into the next chunk is the prefix product just stored (masked lanes are 1.0, so
    # the chunk's last lane holds it): the same value the output has there, and one sum instead
    # of a custom-combine reduce (which the interpreter runs element by element in Python)
    step = (["        c = tl.cumprod(v, 0) * carry",
             "        carry = tl.sum(tl.where(tl.arange(0, BLOCK_S) == BLOCK_S - 1, c, 0.0), 0)"]
            if k.op == "prod" else
            ["        c = tl.cumsum(v, 0) + carry", "        carry = carry + tl.sum(v, 0)"])
    src = ["@triton.jit", f"def {k.name}({args.params()}, BLOCK_S: tl.constexpr):",
           "    ob = tl.program_id(0).to(tl.int64)", *o_lines,
           f"    carry = tl.sum(tl.zeros([BLOCK_S], tl.float32), 0) + {ident}",
           f"    for s_start in range(0, {n_len}, BLOCK_S):",
           "        sb = s_start + tl.arange(0, BLOCK_S)",
           f"        mask = sb < {n_len}", *emit.lines,
           f"        v = tl.where(mask, {v}, {ident})", *step,
           f"        tl.store({k.store.buffer} + {idx}, c, mask=mask)"]
    block = int(knobs.get("BLOCK_S", 1024))
    launch = [f"{k.name}[({py_expr(_numel(k.outer))},)]({args.launch_args()}, BLOCK_S={block}, num_warps={int(knobs.get('num_warps', 4))})"]
    return "\n".join(src), launch


# --------------------------------------------------------------------------- knobs and module

def default_knobs(program: Program, policy: str) -> dict[str, dict[str, Any]]:
    from kforge.agents.expert.codegen.triton.gemm import default_gemm_knobs

    knobs: dict[str, dict[str, Any]] = {}
    for k in program.kernels:
        if isinstance(k, PointwiseKernel):
            knobs[k.name] = {"BLOCK": 1024, "num_warps": 4}
        elif isinstance(k, RowKernel):
            red = program.hint(_numel(k.red))
            if k.red_inner:
                br = min(next_pow2(red), 2048)
                # ~4096 elements a program whatever the row length: a short window (pooling,
                # a 2 x 2 group) gets more rows per program, not 64 rows of 8
                bo = max(1, min(next_pow2(program.hint(_numel(k.outer))), 4096 // br, 1024))
            else:
                bo, br = 64, min(next_pow2(red), 32)
            knobs[k.name] = {"BLOCK_O": bo, "BLOCK_R": br, "num_warps": 8 if bo * br >= 4096 else 4}
        elif isinstance(k, ScanKernel):
            knobs[k.name] = {"BLOCK_S": min(next_pow2(program.hint(k.length)), 1024), "num_warps": 4}
        elif isinstance(k, GemmKernel):
            knobs[k.name] = default_gemm_knobs(program, k, policy)
    if graphable(program):  # on: see triton_graph.py for the measurement behind the default
        from kforge.agents.expert.plan.rounds import dominant

        name = dominant(program)
        if name is not None:
            knobs[name]["cuda_graph"] = 1
    return knobs


PRELUDE = '''"""Generated by the KForge expert agent (Triton): {summary}."""

import os

import torch
import torch.nn as nn
import triton
import triton.language as tl

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # CPU interpreter: correctness only


@triton.jit
def _mul_combine(a, b):
    return a * b


{helpers}
'''


def render_triton(program: Program, knobs: dict[str, dict[str, Any]], policy: str, problem_source: str) -> str:
    from kforge.agents.expert.codegen.triton.gemm import PRECAST_HELPER, gemm_kernel, uses_precast

    sources: list[str] = [PRECAST_HELPER.strip()] if uses_precast(knobs) else []
    launches: dict[str, list[str]] = {}
    for k in program.kernels:
        kk = knobs.get(k.name, {})
        if isinstance(k, PointwiseKernel):
            src, launch = pointwise_kernel(k, kk)
        elif isinstance(k, RowKernel):
            src, launch = row_kernel(k, kk)
        elif isinstance(k, ScanKernel):
            src, launch = scan_kernel(k, kk)
        else:
            src, launch = gemm_kernel(k, kk, policy)
        sources.append(src)
        launches[k.name] = launch

    first = program.kernels[0].name if program.kernels else ""

    def launch(kernel: Kernel) -> list[str]:  # a size the capture fixed: a clear error, not a fault
        return (shape_guard(program) if kernel.name == first else []) + launches[kernel.name]

    device_line = "_device = next(a.device for a in (" + "".join(f"x{i}, " for i in range(len(program.inputs))) + \
        ") if isinstance(a, torch.Tensor))"
    imports, model_new = model_new_source(program, problem_source, launch, device_line)
    known = {"import torch", "import torch.nn as nn", "import triton", "import triton.language as tl", "import os"}
    extra = "".join(f"{line}\n" for line in imports if line not in known)
    knob_text = "; ".join(f"{name}: {kv}" for name, kv in knobs.items())
    helpers = STATE_HELPER
    if any(kv.get("cuda_graph") for kv in knobs.values()) and graphable(program):
        helpers += "\n\n" + GRAPH_HELPER
        model_new = graphed_class(model_new)
    head = PRELUDE.format(summary=f"{program.summary()}; policy {policy}; {knob_text}", helpers=helpers)
    return head + extra + "\n\n" + "\n\n\n".join(sources) + "\n\n\n" + model_new
