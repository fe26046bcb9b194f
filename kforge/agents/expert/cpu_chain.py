"""Shared pieces of CPU code generation: tensor-argument binding, pointwise chains, and
the lane-parallel reduction loop that GCC turns into AVX2 code."""

from __future__ import annotations

from dataclasses import dataclass

from kforge.agents.expert.cpu_math import pointwise_expr
from kforge.agents.expert.graph import Operand, PointwiseOp

LANES = 8  # fp32 lanes of one AVX2 register


@dataclass(frozen=True)
class TensorArg:
    """A tensor a kernel reads, as a C pointer ``cname``."""

    kind: str  # "input" | "param"
    name: str  # forward() argument name or state_dict name
    cname: str


@dataclass(frozen=True)
class Index:
    """C index expressions for the element being produced."""

    full: str
    col: str
    row: str


def chain_tensors(ops: list[PointwiseOp], start: int = 0) -> list[TensorArg]:
    """Tensors read by the chain, in first-use order (deterministic argument order)."""
    seen: dict[tuple[str, str], TensorArg] = {}
    for op in ops:
        for a in op.args:
            if a.kind in ("input", "param") and (a.kind, a.name) not in seen:
                seen[(a.kind, a.name)] = TensorArg(a.kind, a.name, f"t{start + len(seen)}")
    return list(seen.values())


def _operand(a: Operand, tensors: dict[tuple[str, str], str], idx: Index, core: str) -> str:
    if a.kind == "const":
        return f"{float(a.value)!r}f"
    if a.kind == "value":
        return a.name
    if a.kind == "core":
        return core
    ptr = tensors[(a.kind, a.name)]
    where = {"full": idx.full, "per_col": idx.col, "per_row": idx.row, "scalar": "0"}[a.broadcast]
    return f"{ptr}[{where}]"


def chain_code(
    ops: list[PointwiseOp],
    result: Operand,
    tensors: list[TensorArg],
    idx: Index,
    core: str,
    fast: bool,
) -> tuple[str, str]:
    """C statements computing the chain for one element, and the result expression."""
    by_name = {(t.kind, t.name): t.cname for t in tensors}
    lines = []
    for op in ops:
        args = [_operand(a, by_name, idx, core) for a in op.args]
        lines.append(f"const float {op.out} = {pointwise_expr(op.op, args, op.attrs, fast)};")
    return " ".join(lines), _operand(result, by_name, idx, core)


def tensor_params(tensors: list[TensorArg]) -> str:
    return "".join(f"const float* __restrict {t.cname}, " for t in tensors)


def omp_for(threads: bool, simd: bool = False) -> str:
    if threads and simd:
        return "#pragma omp parallel for simd num_threads(nthreads) schedule(static)"
    if threads:
        return "#pragma omp parallel for num_threads(nthreads) schedule(static)"
    if simd:
        return "#pragma omp simd"
    return ""


def lane_reduce(
    var: str,
    init: str,
    combine: str,
    body: str,
    value: str,
    count: str,
    simd: bool,
    unroll: int,
) -> str:
    """C code leaving in ``var`` the reduction of ``value`` over ``cc`` in [0, count).

    ``combine`` is a C macro-like template over ``A`` and ``B`` (e.g. ``"A + B"``);
    ``body`` declares what ``value`` needs from the index ``cc``. With ``simd`` the loop
    keeps ``8 * unroll`` independent partial results (one vector register each 8), which
    lets GCC vectorise a float reduction without -ffast-math.
    """

    def comb(a: str, b: str) -> str:
        return combine.replace("A", a).replace("B", b)

    if not simd:
        return (
            f"float {var} = {init};\n"
            f"for (int64_t cc = 0; cc < {count}; ++cc) {{ {body} {var} = {comb(var, value)}; }}\n"
        )
    lanes = LANES * unroll
    lane = f"{var}_l"
    return (
        f"float {lane}[{lanes}];\n"
        f"for (int l = 0; l < {lanes}; ++l) {lane}[l] = {init};\n"
        f"int64_t {var}_c = 0;\n"
        f"for (; {var}_c + {lanes} <= {count}; {var}_c += {lanes}) {{\n"
        f"  #pragma omp simd\n"
        f"  for (int l = 0; l < {lanes}; ++l) {{ const int64_t cc = {var}_c + l; {body} "
        f"{lane}[l] = {comb(f'{lane}[l]', value)}; }}\n"
        f"}}\n"
        f"float {var} = {init};\n"
        f"for (int l = 0; l < {lanes}; ++l) {var} = {comb(var, f'{lane}[l]')};\n"
        f"for (int64_t cc = {var}_c; cc < {count}; ++cc) {{ {body} {var} = {comb(var, value)}; }}\n"
    )
