"""The Triton backend's pointwise, row and scan kernels (the GEMM is :mod:`.gemm`).

One ``@triton.jit`` kernel per planned kernel, every size a runtime argument (``z0, z1...``,
computed by ``forward`` from the tensors' shapes), every access masked::

    pointwise  1-D grid of BLOCK elements; loop variables by div/mod of the flat offset
    row        BLOCK_O outer rows per program; each pass loops over the reduced space in
               BLOCK_R chunks into a [BLOCK_O, BLOCK_R] accumulator reduced at the pass end;
               outer stores, then one more loop for full stores
    scan       one program per outer row; BLOCK_S chunks, ``tl.cumsum`` / ``tl.cumprod`` plus
               the running carry
    gemm       :mod:`.gemm`

Each returns (the kernel's source, the lines that launch it from ``forward``).
"""

from __future__ import annotations

from kforge.agents.expert.codegen.candidate import py_expr
from kforge.agents.expert.codegen.triton.args import Args, numel_of, resolver, unflatten
from kforge.agents.expert.codegen.triton.expr import TL_DTYPES, TritonEmitter, literal
from kforge.agents.expert.plan.kernels import PointwiseKernel, RowKernel, ScanKernel
from kforge.agents.expert.plan.knobs import TritonPointwise, TritonRow, TritonScan

IDENT = {"sum": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf"), "any": 0, "all": 1,
         "argmax": float("-inf"), "argmin": float("inf")}


# --------------------------------------------------------------------------- pointwise

def pointwise_kernel(k: PointwiseKernel, knobs: TritonPointwise) -> tuple[str, list[str]]:
    args = Args()
    for st in k.stores:
        args.collect(st.index, st.value)
        args.buffer(st.buffer)
    numel = args.size(numel_of(k.space))
    head, names = unflatten("offs", k.space, "p", args, "    ")
    emit = TritonEmitter(resolver(args, names, {}), "mask")
    stores = [f"    tl.store({st.buffer} + {emit.index(st.index)}, {emit(st.value)}, mask=mask)" for st in k.stores]
    block = knobs.BLOCK
    src = [
        "@triton.jit",
        f"def {k.name}({args.params()}, BLOCK: tl.constexpr):",
        "    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)",
        f"    mask = offs < {numel}",
        *head, *emit.lines, *stores,
    ]
    grid = f"(triton.cdiv({py_expr(numel_of(k.space))}, {block}),)"
    launch = [f"{k.name}[{grid}]({args.launch_args()}, BLOCK={block}, num_warps={knobs.num_warps})"]
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


def row_kernel(k: RowKernel, knobs: TritonRow) -> tuple[str, list[str]]:
    args = Args()
    for r in k.reductions:
        args.collect(r.body)
    for st in [*k.outer_stores, *k.full_stores]:
        args.collect(st.index, st.value)
        args.buffer(st.buffer)
    n_outer, n_red = args.size(numel_of(k.outer)), args.size(numel_of(k.red))
    o_lines, names = unflatten("ob", k.outer, "o", args, "    ")
    r_lines, r_names = unflatten("rb", k.red, "r", args, "        ")
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
        emit = TritonEmitter(resolver(args, names, accs), "mask", "        ", prefix=f"p{p}_")
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
    emit = TritonEmitter(resolver(args, names, accs), "omask", prefix="o_")
    stores = [f"    tl.store({st.buffer} + {emit.index(st.index)}, {emit(st.value)}, mask=omask)" for st in k.outer_stores]
    lines += emit.lines + stores
    if k.full_stores:
        lines += loop_head
        emit = TritonEmitter(resolver(args, names, accs), "mask", "        ", prefix="f_")
        stores = [f"        tl.store({st.buffer} + {emit.index(st.index)}, {emit(st.value)}, mask=mask)" for st in k.full_stores]
        lines += emit.lines + stores
    src = ["@triton.jit", f"def {k.name}({args.params()}, BLOCK_O: tl.constexpr, BLOCK_R: tl.constexpr):", *lines]
    bo, br = knobs.BLOCK_O, knobs.BLOCK_R
    grid = f"(triton.cdiv({py_expr(numel_of(k.outer))}, {bo}),)"
    launch = [f"{k.name}[{grid}]({args.launch_args()}, BLOCK_O={bo}, BLOCK_R={br}, num_warps={knobs.num_warps})"]
    return "\n".join(src), launch


# --------------------------------------------------------------------------- scan

def scan_kernel(k: ScanKernel, knobs: TritonScan) -> tuple[str, list[str]]:
    args = Args()
    args.collect(k.body, k.store.index)
    args.buffer(k.store.buffer)
    n_len = args.size(k.length)
    o_lines, names = unflatten("ob", k.outer, "o", args, "    ")
    names["s"] = "sb"
    emit = TritonEmitter(resolver(args, names, {"scan": "c"}), "mask", "        ")
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
    block = knobs.BLOCK_S
    launch = [f"{k.name}[({py_expr(numel_of(k.outer))},)]({args.launch_args()}, BLOCK_S={block}, num_warps={knobs.num_warps})"]
    return "\n".join(src), launch
