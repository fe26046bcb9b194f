"""Triton GEMM template for a :class:`~kforge.agents.expert.plan.kernels.GemmKernel`: strided
operands, fused epilogue.

``out[b, m, n] = epilogue(sum_k A[b, m, k] * B[b, k, n])``; A and B are read through the
strides the planner found (a transposed ``nn.Linear`` weight, a batch, a broadcast operand
are all just strides), tiles are GROUP_M-swizzled, the K loop accumulates in fp32 and the
epilogue's stores run on the finished tile. The ``precision`` knob is a step of the ladder
(``plan/precision.py``: its cost, error and policy); this is how each step computes::

    ieee     fp32 x fp32, exact fp32 FMA (no tensor cores)                  strict
    tf32x3   fp32, error-compensated TF32 (3 tensor-core passes, ~1e-6)     strict
    tf32     fp32 rounded to TF32 (10-bit mantissa, ~1e-3)                  relaxed
    bf16     operands rounded to bf16, fp32 accumulate (~1e-2)              relaxed
    bf16x2   A split hi/lo, B rounded once: hi*hi + lo*hi (~2e-3)           relaxed
    bf16x3   hi/lo bf16 split: hi*hi + hi*lo + lo*hi (~1e-5)                strict, relaxed
    fp16, fp16x2, fp16x3  the same with fp16 parts: the tensor cores' bf16 rate, 3 more mantissa
             bits, range +-65504 (an overflow fails verification and the ladder leaves the
             fp16 steps). A split's lo parts are stored times 2^11 (``precision.FP16_LO_SCALE``: exact,
             and never past fp16's range, since |x - hi| <= |hi| 2^-11), so a weight-sized lo
             (~5e-6) stays a normal fp16 number instead of a subnormal one with a few bits; the
             lo products go to an accumulator of their own, scaled back once after the K loop.
             fp16x3 then has tf32x3's error (~10x less than with unscaled lo parts, CPU
             simulation: benchmarks/results/half_split_error_cpu.md)  fp16x3 strict too

A mismatch moves the ladder up (``plan/rounds.py``). The ``precast`` knob prepares each operand once per call in a small pass
(``_kf_precast``): on the bf16 steps it rounds / splits it to bf16 hi [and lo], laid out along
its contiguous dimension, so the K loop streams half the bytes and feeds the tensor cores
straight from shared memory (without it the K loop loads fp32 and converts every tile in
registers); on the fp32 steps it copies an operand whose K is not its contiguous dimension into a
K-major one (TF32 tensor-core operands must be K-major; a transposed tile costs 1.5-4x).
The ``b_regs`` knob (the default of bf16, fp16 and fp16x3: :data:`.tiles.STEP_TILES`) precasts A
only: B is loaded as fp32 and rounded [and split] in registers, and the tile is computed
transposed (``acc`` is [BLOCK_N, BLOCK_M], B's tile is ``tl.dot``'s first operand) so the
converted operand feeds the tensor cores from registers; the weight then costs no pass of its
own per call. With it the ``tma`` knob (on by default) loads both tiles through host TMA
descriptors (``_kf_tma``) where each operand is a 2-D view with a contiguous K and 16-byte
aligned rows, and the same kernel's pointer loads elsewhere (a batch, a ragged K): on the H100,
0.281 against 0.360 ms a call for 001 relaxed (``benchmarks/results/call_overhead_gpu.md``).

The CPU interpreter's bf16 ``tl.dot`` is wrong (Triton 3.9), so under ``TRITON_INTERPRET=1``
bf16 products are computed as fp32 products of the bf16-rounded operands: the same
arithmetic, checkable on a CPU.
"""

from __future__ import annotations

from typing import Any

import sympy

from kforge.agents.expert.codegen.candidate import py_expr
from kforge.agents.expert.codegen.triton.args import Args, resolver
from kforge.agents.expert.codegen.triton.expr import TritonEmitter
from kforge.agents.expert.codegen.triton.tiles import b_in_registers
from kforge.agents.expert.plan.expr import as_size
from kforge.agents.expert.plan.gather import invariant_parts
from kforge.agents.expert.plan.kernels import GemmKernel
from kforge.agents.expert.plan.knobs import TritonGemm
from kforge.agents.expert.plan.precision import FP16_LO_SCALE, STEPS, Step


def half_type(step: Step) -> str:
    """The Triton type of a 16-bit step's parts."""
    return "tl.float16" if step.parts == "fp16" else "tl.bfloat16"


def _half_dot(x: str, y: str, swap: bool = False, acc: str = "acc") -> list[str]:
    x, y = (y, x) if swap else (x, y)
    return ["if INTERPRETED:",
            f"    {acc} = tl.dot({x}.to(tl.float32), {y}.to(tl.float32), {acc}, input_precision='ieee')",
            "else:",
            f"    {acc} = tl.dot({x}, {y}, {acc})"]


def loop_body(step: Step, a_ready: bool = False, b_ready: bool = False, swap: bool = False) -> list[str]:
    """The K loop's products. ``a_ready`` / ``b_ready``: the tile arrives precast (16-bit hi
    [and lo]), else as fp32, rounded [and split] here in registers. ``swap``: the tile is computed
    transposed (B's tile is ``tl.dot``'s first operand, which wgmma reads from registers): the
    ``b_regs`` path, where B never takes a separate pass through memory; a gathered A (an
    implicit GEMM) is rounded in registers as the first operand without it."""
    if step.parts is None:
        return [f"acc = tl.dot(a, b, acc, input_precision={step.name!r})"]
    split_a, split_b = step.split
    half = half_type(step)
    # fp16 splits: lo scaled by 2^11 into an accumulator of its own (``Step.scaled_lo``)
    lo_acc, up = ("acc_lo", f" * {FP16_LO_SCALE}.0") if step.scaled_lo else ("acc", "")
    lines = [] if a_ready else [f"a_hi = a.to({half})"]
    lines += [] if b_ready else [f"b_hi = b.to({half})"]
    if split_a and not a_ready:
        lines.append(f"a_lo = ((a - a_hi.to(tl.float32)){up}).to({half})")
    if split_b and not b_ready:
        lines.append(f"b_lo = ((b - b_hi.to(tl.float32)){up}).to({half})")
    if split_b:
        lines += _half_dot("a_hi", "b_lo", swap, lo_acc)
    if split_a:
        lines += _half_dot("a_lo", "b_hi", swap, lo_acc)
    return lines + _half_dot("a_hi", "b_hi", swap)


PRECAST_HELPER = '''
@triton.jit
def _kf_precast_kernel(src, hi, lo, off, R, C, s_b, s_r, s_c, d_b, d_r, d_c,
                       BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, MODE: tl.constexpr, FP16: tl.constexpr):
    b = tl.program_id(2).to(tl.int64)
    r = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)[:, None]
    c = (tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)).to(tl.int64)[None, :]
    mask = (r < R) & (c < C)
    x = tl.load(src + off + b * s_b + r * s_r + c * s_c, mask=mask, other=0.0).to(tl.float32)
    if MODE == 0:  # fp32 copy in another layout
        tl.store(hi + b * d_b + r * d_r + c * d_c, x, mask=mask)
    elif FP16:  # lo times 2^11 (FP16_LO_SCALE): a normal fp16 number where the plain lo is subnormal
        h = x.to(tl.float16)
        tl.store(hi + b * d_b + r * d_r + c * d_c, h, mask=mask)
        if MODE == 2:
            tl.store(lo + b * d_b + r * d_r + c * d_c, ((x - h.to(tl.float32)) * @LO_SCALE@).to(tl.float16), mask=mask)
    else:
        h = x.to(tl.bfloat16)
        tl.store(hi + b * d_b + r * d_r + c * d_c, h, mask=mask)
        if MODE == 2:
            tl.store(lo + b * d_b + r * d_r + c * d_c, (x - h.to(tl.float32)).to(tl.bfloat16), mask=mask)


def _kf_precast(src, off, strides, nb, rows, cols, mode, k_dim, fp16=False):
    """One operand for the K loop -> (hi, lo, strides, offset). mode 1 / 2: bf16 (``fp16``: fp16) hi [and lo],
    laid out along the operand's contiguous dimension; mode 0 (fp32 steps): the operand as it is
    when K (``k_dim``: 1 rows, 2 cols) is its contiguous dimension, else an fp32 copy with K
    contiguous (TF32 tensor-core operands must be K-major in shared memory)."""
    s_b, s_r, s_c = strides
    nb = 1 if s_b == 0 else nb
    if mode == 0:
        if (s_c if k_dim == 2 else s_r) == 1 or rows * cols <= 1:
            return src, src, strides, off
        row_major = k_dim == 2
    else:
        row_major = s_c == 1 or (s_r != 1 and s_c <= s_r)
    shape = (nb, rows, cols) if row_major else (nb, cols, rows)
    dtype = torch.float32 if mode == 0 else (torch.float16 if fp16 else torch.bfloat16)
    hi = torch.empty(shape, dtype=dtype, device=src.device)
    lo = torch.empty(shape, dtype=dtype, device=src.device) if mode == 2 else hi
    d = (rows * cols, cols, 1) if row_major else (rows * cols, 1, rows)
    grid = (triton.cdiv(rows, 64), triton.cdiv(cols, 64), nb)
    _kf_precast_kernel[grid](src, hi, lo, off, rows, cols, s_b, s_r, s_c, *d,
                             BLOCK_R=64, BLOCK_C=64, MODE=mode, FP16=fp16, num_warps=4)
    return hi, lo, ((0 if s_b == 0 else d[0]), d[1], d[2]), 0


from triton.tools.tensor_descriptor import TensorDescriptor as _KfTensorDescriptor  # Triton >= 3.3


def _kf_tma(t, off, strides, nb, rows, cols, block):
    """A TMA descriptor over the 2-D operand ``t[off + r * s_r + c]`` (rows x cols, ``block``
    a tile), or None where the tensor memory accelerator cannot read it: a batch, a dimension
    that is not contiguous, an address or a row stride off 16 bytes."""
    s_b, s_r, s_c = strides
    if (nb != 1 and s_b != 0) or s_c != 1 or rows * cols == 0:
        return None
    size = t.element_size()
    if (t.data_ptr() + off * size) % 16 or (s_r * size) % 16:
        return None
    view = torch.as_strided(t, (rows, cols), (s_r, 1), t.storage_offset() + off)
    return _KfTensorDescriptor.from_tensor(view, list(block))
'''.replace("@LO_SCALE@", f"{FP16_LO_SCALE}.0")


AS_F32 = ".to(tl.float32)"  # an operand read as it is stored (f32, bf16, f16) computes in f32


def uses_precast(knobs: list[TritonGemm]) -> bool:
    return any(k.precast for k in knobs)


def gemm_kernel(k: GemmKernel, knobs: TritonGemm) -> tuple[str, list[str]]:
    step = STEPS[knobs.precision]
    precast = bool(knobs.precast)
    gather = bool(knobs.gather) and k.a.gather is not None  # A through its index map (an implicit GEMM)
    b_regs = b_in_registers(knobs) and not gather
    tma = b_regs and bool(knobs.tma)
    args = Args()
    if gather:
        args.collect(k.a.gather)  # type: ignore[arg-type]
    elif not precast:
        args.buffer(k.a.buffer)
    if not precast or b_regs:
        args.buffer(k.b.buffer)
    for st in k.stores:
        args.collect(st.index, st.value)
        args.buffer(st.buffer)
    sizes = {n: args.size(v) for n, v in (("M", k.m), ("N", k.n), ("K", k.k))}

    def stride(e: Any) -> str:
        return str(e.v) if e.op == "const" else args.size(as_size(e))

    def py_stride(e: Any) -> str:
        return str(e.v) if e.op == "const" else f"({py_expr(as_size(e))})"

    split_a, split_b = step.split
    if gather:  # A evaluated per tile; B precast (hi [lo], or a K-major fp32 copy) or read as it is
        operands = "pb_hi, pb_lo, sb0, sb1, sb2, ob, " if precast else ""
        sa, sb = ["0", "0", "0"], (["sb0", "sb1", "sb2"] if precast else [stride(e) for e in k.b.strides])
        b_tiles = ["b_hi"] + (["b_lo"] if split_b else []) if precast and step.parts is not None else ["b"]
        loads = {"a": [], "b": b_tiles}
    elif b_regs:
        operands = "pa_hi, pa_lo, sa0, sa1, sa2, oa, " + ("a_desc, alo_desc, b_desc, " if tma else "")
        sa, sb = ["sa0", "sa1", "sa2"], [stride(e) for e in k.b.strides]
        loads = {"a": ["a_hi"] + (["a_lo"] if split_a else []), "b": ["b"]}
    elif precast:
        operands = "pa_hi, pa_lo, pb_hi, pb_lo, sa0, sa1, sa2, sb0, sb1, sb2, oa, ob, "
        sa, sb = ["sa0", "sa1", "sa2"], ["sb0", "sb1", "sb2"]
        if step.parts is not None:
            loads = {"a": ["a_hi"] + (["a_lo"] if split_a else []), "b": ["b_hi"] + (["b_lo"] if split_b else [])}
        else:  # fp32 operands, K-major
            loads = {"a": ["a"], "b": ["b"]}
    else:
        operands = ""
        sa = [stride(e) for e in k.a.strides]
        sb = [stride(e) for e in k.b.strides]
        loads = {"a": ["a"], "b": ["b"]}
    emit = TritonEmitter(resolver(args, {"e0": "bb", "e1": "rm2", "e2": "rn2"}, {"acc": "acc"}), "out_mask",
                         scalars=frozenset({"e0"}))
    stores = [f"    tl.store({st.buffer} + {emit.index(st.index)}, {emit(st.value)}, mask=out_mask)" for st in k.stores]
    ready = precast and step.parts is not None
    body = "\n".join("        " + line for line in loop_body(step, a_ready=ready and not gather,
                                                              b_ready=ready and not b_regs, swap=b_regs))
    M, N, K = sizes["M"], sizes["N"], sizes["K"]
    # b_regs: tiles and accumulator transposed ([BLOCK_K, BLOCK_M] of A, [BLOCK_N, BLOCK_K] of B)
    a_k, b_k = ("rk[:, None]", "rk[None, :]") if b_regs else ("rk[None, :]", "rk[:, None]")

    def tma_lines() -> str:  # TMA tiles: [BLOCK_M, BLOCK_K] of A (transposed here), [BLOCK_N, BLOCK_K] of B
        out = [f"            {name} = tl.trans({'alo' if name == 'a_lo' else 'a'}_desc.load([pid_m * BLOCK_M, k0]))"
               for name in loads["a"]]
        return "\n".join(out + ["            b = b_desc.load([pid_n * BLOCK_N, k0]).to(tl.float32)"])

    def load_lines(masked: bool) -> str:
        out = []
        for name in loads["a"]:
            ptr = f"{'pa_lo' if name == 'a_lo' else 'pa_hi'} + a_off" if precast else f"{k.a.buffer} + a_off"
            mask = f", mask={a_k} < K_LEFT, other=0.0" if masked else ""
            out.append(f"            {name} = tl.load({ptr}{mask})" + ("" if precast else AS_F32))
        for name in loads["b"]:
            raw = not (precast and not b_regs)
            ptr = f"{k.b.buffer} + b_off" if raw else f"{'pb_lo' if name == 'b_lo' else 'pb_hi'} + b_off"
            mask = f", mask={b_k} < K_LEFT, other=0.0" if masked else ""
            out.append(f"            {name} = tl.load({ptr}{mask})" + (AS_F32 if raw else ""))
        return "\n".join(out).replace("K_LEFT", f"{K} - k0")

    a_rel = "" if gather else f"(bb * {sa[0]} + " + ("oa" if precast else stride(k.a.offset)) + ")"
    b_rel = f"(bb * {sb[0]} + " + ("ob" if precast and not b_regs else stride(k.b.offset)) + ")"
    a_rows, b_cols = f"(rm % {M}).to(tl.int64)", f"(rn % {N}).to(tl.int64)"
    gather_lines = ""
    if gather:
        names = {"g0": "bb", "g1": "ga_m", "g2": "ga_k"}
        hoist = TritonEmitter(resolver(args, names, {}), "a_mask", indent="    ", prefix="gh", scalars=frozenset({"g0"}))
        for part in invariant_parts(k.a.gather, "g2"):  # type: ignore[arg-type]
            hoist(part)  # once per tile: the output position's divisions
        inner = TritonEmitter(resolver(args, names, {}), "a_mask", indent="        ", prefix="ga",
                              scalars=frozenset({"g0"}))
        inner.cache.update(hoist.cache)
        a_code = inner(k.a.gather)  # type: ignore[arg-type]
        # the map's index arithmetic in int32 where every buffer it reads has < 2^31 elements
        # (IDX64 from the launch): int64 ops are two to three int32 instructions on the GPU
        offsets = (f"    ga_m = (rm % {M})[:, None]\n    if IDX64:\n        ga_m = ga_m.to(tl.int64)\n"
                   + "\n".join(hoist.lines) + "\n"
                   f"    b_off = {b_rel} + rk[:, None] * {sb[1]} + {b_cols}[None, :] * {sb[2]}\n"
                   "    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)")
        gather_lines = "\n".join(["        ga_k = (k0 + rk)[None, :]",
                                   "        if IDX64:", "            ga_k = ga_k.to(tl.int64)",
                                   f"        a_mask = ga_k < {K}", *inner.lines, f"        a = {a_code}"]) + "\n"
    elif b_regs:
        offsets = (f"    a_off = {a_rel} + {a_rows}[None, :] * {sa[1]} + rk[:, None] * {sa[2]}\n"
                   f"    b_off = {b_rel} + rk[None, :] * {sb[1]} + {b_cols}[:, None] * {sb[2]}\n"
                   "    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)")
    else:
        offsets = (f"    a_off = {a_rel} + {a_rows}[:, None] * {sa[1]} + rk[None, :] * {sa[2]}\n"
                   f"    b_off = {b_rel} + rk[:, None] * {sb[1]} + {b_cols}[None, :] * {sb[2]}\n"
                   "    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)")
    untranspose = "    acc = tl.trans(acc)\n" if b_regs else ""
    if step.scaled_lo:  # the lo products' accumulator, scaled back once (exact: 2^-11)
        offsets += "\n    acc_lo = tl.zeros_like(acc)"
        untranspose = f"    acc += acc_lo * (1.0 / {FP16_LO_SCALE})\n" + untranspose
    src = f"""@triton.jit
def {k.name}({operands}{args.params()},
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, INTERPRETED: tl.constexpr{", TMA: tl.constexpr" if tma else ""}{", IDX64: tl.constexpr" if gather else ""}):
    pid = tl.program_id(0)
    bb = tl.program_id(1).to(tl.int64)
    num_m = tl.cdiv({M}, BLOCK_M)
    num_n = tl.cdiv({N}, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
{offsets}
    for k0 in range(0, {K}, BLOCK_K):
{gather_lines}{"        if TMA:" + chr(10) + tma_lines() + chr(10) + "        elif EVEN_K:" if tma else "        if EVEN_K:"}
{load_lines(False)}
        else:
{load_lines(True)}
{body}
{"" if gather else f"        a_off += BLOCK_K * {sa[2]}{chr(10)}"}        b_off += BLOCK_K * {sb[1]}
{untranspose}    rm2 = rm.to(tl.int64)[:, None]
    rn2 = rn.to(tl.int64)[None, :]
    out_mask = (rm2 < {M}) & (rn2 < {N})
{chr(10).join(emit.lines)}
{chr(10).join(stores)}"""
    bm, bn, bk = knobs.BLOCK_M, knobs.BLOCK_N, knobs.BLOCK_K
    batch = py_expr(k.batch) if k.batch is not None else "1"
    grid = f"(triton.cdiv({py_expr(k.m)}, {bm}) * triton.cdiv({py_expr(k.n)}, {bn}), {batch})"
    even = f"({py_expr(k.k)}) % {bk} == 0" if not sympy.sympify(k.k).is_Integer else str(int(k.k) % bk == 0)
    launch: list[str] = []
    call_operands = ""
    gathered = sorted({e.v for e in k.a.gather.walk() if e.op == "load"}) if gather else []  # type: ignore[union-attr]
    idx64 = f"max({', '.join(f'{b}.numel()' for b in gathered)}, 0) >= 2**31"
    if precast:
        bf16 = step.parts is not None
        fp16 = ", fp16=True" if step.parts == "fp16" else ""
        ops = (("a", k.a, k.m, k.k, split_a, 2), ("b", k.b, k.k, k.n, split_b, 1))
        for op, name, rows, cols, split, k_dim in ops[:1] if b_regs else (ops[1:] if gather else ops):
            st = ", ".join(py_stride(e) for e in name.strides)
            mode = (2 if split else 1) if bf16 else 0
            launch.append(f"_p{op}_hi, _p{op}_lo, _s{op}, _o{op} = _kf_precast({name.buffer}, {py_stride(name.offset)}, ({st}), "
                          f"{batch}, {py_expr(rows)}, {py_expr(cols)}, {mode}, {k_dim}{fp16})")
        if tma:  # TMA where every operand allows it (:func:`_kf_tma`), else the pointer loads
            b_st = ", ".join(py_stride(e) for e in k.b.strides)
            blocks = f"({bm}, {knobs.BLOCK_K})", f"({knobs.BLOCK_N}, {knobs.BLOCK_K})"
            launch += [f"_ta = _kf_tma(_pa_hi, _oa, _sa, {batch}, {py_expr(k.m)}, {py_expr(k.k)}, {blocks[0]})",
                       f"_tl = _kf_tma(_pa_lo, _oa, _sa, {batch}, {py_expr(k.m)}, {py_expr(k.k)}, {blocks[0]})"
                       if split_a else "_tl = _ta",
                       f"_bst = ({b_st})",
                       f"_tb = _kf_tma({k.b.buffer}, {py_stride(k.b.offset)}, (_bst[0], _bst[2], _bst[1]), {batch}, "
                       f"{py_expr(k.n)}, {py_expr(k.k)}, {blocks[1]})",
                       "_tma = _ta is not None and _tl is not None and _tb is not None",
                       "if not _tma:",
                       "    _ta = _tl = _tb = None"]
        if gather:
            call_operands = "_pb_hi, _pb_lo, *_sb, _ob, "
        elif b_regs:
            call_operands = "_pa_hi, _pa_lo, *_sa, _oa, " + ("_ta, _tl, _tb, " if tma else "")
        else:
            call_operands = "_pa_hi, _pa_lo, _pb_hi, _pb_lo, *_sa, *_sb, _oa, _ob, "
    launch.append(f"{k.name}[{grid}]({call_operands}{args.launch_args()}, BLOCK_M={bm}, BLOCK_N={bn}, BLOCK_K={bk}, "
                  f"GROUP_M={knobs.GROUP_M}, EVEN_K={even}, INTERPRETED=_INTERPRETED, " + ("TMA=_tma, " if tma else "") +
                  (f"IDX64={idx64}, " if gather else "") +
                  f"num_warps={knobs.num_warps}, num_stages={knobs.num_stages})")
    return src, launch
