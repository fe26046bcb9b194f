"""The C-style emitter the C++ (``cpu``) and CUDA (``cuda``) backends share: E trees as C
definitions placed in a tree of loop scopes, and the C column of the op table.

:class:`CEmitter` turns an ``E`` into C inside a tree of loop :class:`Scope` s. Every compound
node becomes one ``const T tN = ...;`` definition (shared subtrees are computed once) placed in
the *outermost* scope that holds all the loop variables and accumulators it reads: a bias load
over the column index leaves the row loop, a row mean leaves the column loop. :class:`Block` s
hold the loop headers and statements; a scope's definitions are rendered at the top of its
block, so they precede every statement that reads them.

:func:`c_ops` is the C rendering of every pointwise and index op, over a :class:`CMath`
naming the transcendental functions (the CPU's branch-free ``kf_*`` ones, or libm's ``std::``
ones, which CUDA device code calls too); each backend adds or leaves out rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import sympy

from kforge.agents.expert.codegen.candidate import size_source
from kforge.agents.expert.codegen.optable import Call, OpTable, binary, decompose, render
from kforge.agents.expert.errors import UnsupportedError
from kforge.agents.expert.ir.ops import LN_2, LOG2_E
from kforge.agents.expert.plan.expr import E
from kforge.agents.expert.plan.kernels import Program, Reduction, Store

CTYPES = {"f32": "float", "i64": "int64_t", "i32": "int32_t", "bool": "bool"}


def division_helpers(qualifier: str) -> str:
    """The C column's integer floor division and modulo, and the float modulo with Python's
    sign, declared with a backend's function qualifier (``KF_INLINE``, ``KF_DEVICE``)."""
    return f"""{qualifier} int64_t kf_floordiv(int64_t a, int64_t b) {{
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}}
{qualifier} int64_t kf_mod(int64_t a, int64_t b) {{
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}}
{qualifier} float kf_fmod(float a, float b) {{
    float r = std::fmod(a, b);
    return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
}}
"""


def render_expr(e: E, table: OpTable) -> str:
    """One expression and the definitions it needs, in a scope holding its loop variables."""
    em = CEmitter(table)
    scope = Scope(None, tuple(x.v[0] for x in e.walk() if x.op == "var"))
    code = em.expr(e, scope)
    return "\n".join([*scope.defs, code])


def literal(v: Any, dt: str) -> str:
    if dt == "bool":
        return "true" if v else "false"
    if dt in ("i64", "i32"):
        return f"(({CTYPES[dt]}){int(v)})"
    f = float(v)
    if math.isnan(f):
        return "NAN"
    if math.isinf(f):
        return "INFINITY" if f > 0 else "(-INFINITY)"
    return f"{f!r}f"


@dataclass(frozen=True)
class CMath:
    """The C functions a backend computes the transcendental ops with."""

    exp: str
    log: str
    expm1: str
    log1p: str
    tanh: str
    erf: str


LIBM = CMath("std::exp", "std::log", "std::expm1", "std::log1p", "std::tanh", "std::erf")


def _zero(dt: str) -> str:
    return "0.0f" if dt == "f32" else f"(({CTYPES[dt]})0)"


def _pow(c: Call) -> str:
    x, ex = c.args
    b = c.e.args[1]
    if b.op == "const" and b.dt != "bool":
        p = float(b.v)
        if p == int(p) and 0 <= p <= 4:
            return "(" + " * ".join([x] * int(p)) + ")" if p else literal(1, c.dt)
        if p == int(p) and -4 <= p < 0:
            return "(1.0f / (" + " * ".join([x] * int(-p)) + "))"
        if p == 0.5:
            return f"std::sqrt({x})"
    if c.dt != "f32":
        return f"(({CTYPES[c.dt]})std::pow((double){x}, (double){ex}))"
    return f"std::pow({x}, (float){ex})"


def _float_or(f32: str, other: str) -> Any:
    """A rendering that differs between f32 and integer / bool operands."""
    return lambda c: (f32 if c.dt == "f32" else other).format(x=c.x, y=c.args[1] if len(c.args) > 1 else "")


def c_ops(m: CMath) -> dict[str, Any]:
    """The C column of the op table over the functions ``m`` names."""
    return {
        **{op: binary(sym) for op, sym in (
            ("iadd", "+"), ("isub", "-"), ("imul", "*"), ("add", "+"), ("sub", "-"), ("mul", "*"), ("eq", "=="),
            ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">="), ("logical_and", "&&"),
            ("logical_or", "||"), ("logical_xor", "!="), ("ifloordiv", "/"), ("imod", "%"), ("div", "/"))},
        **{op: (lambda c: f"kf_min<{CTYPES[c.dt]}>({c.x}, {c.y})") for op in ("imin", "minimum")},
        **{op: (lambda c: f"kf_max<{CTYPES[c.dt]}>({c.x}, {c.y})") for op in ("imax", "maximum")},
        "floordiv": _float_or("std::floor({x} / {y})", "kf_floordiv({x}, {y})"),
        "truncdiv": _float_or("std::trunc({x} / {y})", "({x} / {y})"),
        "remainder": _float_or("kf_fmod({x}, {y})", "kf_mod({x}, {y})"),
        "where": "({x} ? {y} : {z})",
        "cast": lambda c: f"({c.x} != 0)" if c.dt == "bool" else f"(({CTYPES[c.dt]}){c.x})",
        "pow": _pow,
        "neg": "(-{x})",
        "abs": lambda c: f"std::fabs({c.x})" if c.dt == "f32" else f"({c.x} < {_zero(c.dt)} ? -{c.x} : {c.x})",
        "exp": f"{m.exp}({{x}})",
        "exp2": f"{m.exp}({{x}} * {LN_2!r}f)",
        "expm1": f"{m.expm1}({{x}})",
        "log": f"{m.log}({{x}})",
        "log2": f"({m.log}({{x}}) * {LOG2_E!r}f)",
        "log1p": f"{m.log1p}({{x}})",
        "sqrt": "std::sqrt({x})", "rsqrt": "(1.0f / std::sqrt({x}))", "reciprocal": "(1.0f / {x})",
        "sigmoid": f"(1.0f / (1.0f + {m.exp}(-{{x}})))",
        "tanh": f"{m.tanh}({{x}})",
        "relu": lambda c: f"({c.x} < {_zero(c.dt)} ? {_zero(c.dt)} : {c.x})",
        "erf": f"{m.erf}({{x}})",
        "sin": "std::sin({x})", "cos": "std::cos({x})",
        "sign": lambda c: f"(({CTYPES[c.dt]})(({c.x} > {_zero(c.dt)}) - ({c.x} < {_zero(c.dt)})))",
        "floor": _float_or("std::floor({x})", "{x}"), "ceil": _float_or("std::ceil({x})", "{x}"),
        "round": _float_or("std::nearbyint({x})", "{x}"), "trunc": _float_or("std::trunc({x})", "{x}"),
        "isnan": "({x} != {x})", "logical_not": "(!{x})",
        "clamp": _clamp,
    }


def _clamp(c: Call) -> str:
    out = c.x
    if c.attrs.min is not None:
        out = f"kf_max<{CTYPES[c.dt]}>({out}, {literal(c.attrs.min, c.dt)})"
    if c.attrs.max is not None:
        out = f"kf_min<{CTYPES[c.dt]}>({out}, {literal(c.attrs.max, c.dt)})"
    return out


class Scope:
    """A loop body: the loop variables and accumulators it can read, its hoisted definitions."""

    def __init__(self, parent: Scope | None, new_vars: tuple[str, ...] = (), new_accs: tuple[str, ...] = ()) -> None:
        self.parent = parent
        self.vars: set[str] = (parent.vars if parent else set()) | set(new_vars)
        self.accs: set[str] = (parent.accs if parent else set()) | set(new_accs)
        self.defs: list[str] = []
        self.memo: dict[E, str] = {}

    def child(self, new_vars: tuple[str, ...] = (), new_accs: tuple[str, ...] = ()) -> Scope:
        return Scope(self, new_vars, new_accs)


@dataclass
class Block:
    """``head`` (pragmas and a ``for``), then ``{`` definitions, items ``}``."""

    scope: Scope
    head: str = ""
    items: list[str | Block] = field(default_factory=list)

    def add(self, item: str | Block) -> None:
        self.items.append(item)

    def render(self, indent: int = 1) -> str:
        pad = "  " * indent
        out = [pad + h for h in self.head.splitlines()] if self.head else []
        out.append(pad + "{")
        out += ["  " + pad + d for d in self.scope.defs]
        for it in self.items:
            out.append(it.render(indent + 1) if isinstance(it, Block) else "\n".join("  " + pad + s for s in it.splitlines()))
        out.append(pad + "}")
        return "\n".join(out)


class CEmitter:
    """C for E trees of one kernel, each op through the backend's ``table`` (an op the table
    lacks through its decomposition). ``sizes`` collects every size expression read (the
    kernel's size arguments); ``accs`` maps an accumulator name to its C value and the loop
    variables that value depends on; ``buffers`` maps a buffer to its pointer name."""

    def __init__(self, table: OpTable) -> None:
        self.table = table
        self.buffers: dict[str, str] = {}
        self.sizes: dict[Any, str] = {}
        self.accs: dict[str, tuple[str, frozenset[str]]] = {}
        self.count = 0
        self._needs: dict[E, tuple[frozenset[str], frozenset[str]]] = {}

    def size(self, expr: Any) -> str:
        if expr not in self.sizes:
            self.sizes[expr] = f"z{len(self.sizes)}"
        return self.sizes[expr]

    def ptr(self, buffer: str) -> str:
        if buffer not in self.buffers:
            self.buffers[buffer] = f"b_{buffer}"
        return self.buffers[buffer]

    def needs(self, e: E) -> tuple[frozenset[str], frozenset[str]]:
        """(loop variables, accumulators) an expression reads."""
        hit = self._needs.get(e)
        if hit is None:
            if e.op == "var":
                hit = (frozenset([e.v[0]]), frozenset())
            elif e.op == "acc":
                hit = (self.accs[e.v][1] if e.v in self.accs else frozenset(), frozenset([e.v]))
            else:
                vs: frozenset[str] = frozenset()
                acs: frozenset[str] = frozenset()
                for a in e.args:
                    v, c = self.needs(a)
                    vs, acs = vs | v, acs | c
                hit = (vs, acs)
            self._needs[e] = hit
        return hit

    def expr(self, e: E, scope: Scope) -> str:
        if e.op == "const":
            return literal(e.v, e.dt)
        if e.op == "var":
            return str(e.v[0])
        if e.op == "size":
            return self.size(e.v)
        if e.op == "acc":
            if e.v not in self.accs:
                raise UnsupportedError(f"accumulator {e.v} read outside its kernel")
            return self.accs[e.v][0]
        if e.op != "load" and e.op not in self.table:  # through the op's decomposition
            return self.expr(decompose(e), scope)
        vs, acs = self.needs(e)
        target = scope
        while target.parent is not None and vs <= target.parent.vars and acs <= target.parent.accs:
            target = target.parent
        s: Scope | None = target
        while s is not None:
            if e in s.memo:
                return s.memo[e]
            s = s.parent
        args = [self.expr(a, target) for a in e.args]
        code = f"{self.ptr(e.v)}[{args[0]}]" if e.op == "load" else render(self.table, Call(tuple(args), e))
        name = f"t{self.count}"
        self.count += 1
        target.defs.append(f"const {CTYPES[e.dt]} {name} = {code};")
        target.memo[e] = name
        return name


class CKernel:
    """What a C-style kernel renderer needs of one kernel: its sizes and products as C, its
    stores, loop variables decoded from a flat index, loop nests, and its parameters."""

    def __init__(self, kernel: Any, program: Program, table: OpTable) -> None:
        self.k, self.p = kernel, program
        self.em = CEmitter(table)
        self.fn = f"kf_{kernel.name}"

    def dim(self, expr: Any) -> str:
        e = sympy.sympify(expr)
        return f"((int64_t){int(e)})" if e.is_number else self.em.size(e)

    def prod(self, dims: list[str]) -> str:
        return " * ".join(dims) if dims else "((int64_t)1)"

    def slot(self, s: Store, scope: Scope) -> str:
        """The element a store writes (``ptr[index]``): also a place to keep a value in."""
        return f"{self.em.ptr(s.buffer)}[{self.em.expr(s.index, scope)}]"

    def store(self, s: Store, scope: Scope) -> str:
        slot = self.slot(s, scope)
        val = self.em.expr(s.value, scope)
        return f"{slot} = ({CTYPES[self.p.buffers[s.buffer].dtype]}){val};"

    @staticmethod
    def decode(q: str, names: list[str], dims: list[str]) -> list[str]:
        """Loop variables ``names`` (row-major over ``dims``) from the flat index ``q``."""
        if not names:
            return []
        if len(names) == 1:
            return [f"const int64_t {names[0]} = {q};"]
        out = [f"int64_t {q}_r = {q};"]
        for n, d in reversed(list(zip(names[1:], dims[1:], strict=True))):
            out.append(f"const int64_t {n} = {q}_r % {d}; {q}_r /= {d};")
        out.append(f"const int64_t {names[0]} = {q}_r;")
        return out

    @staticmethod
    def nest(parent: Block, names: list[str], dims: list[str], pragma: str) -> Block:
        """Sequential loops over ``names``; the innermost carries ``pragma``; returns it."""
        cur = parent
        for i, (n, d) in enumerate(zip(names, dims, strict=True)):
            head = (pragma if i == len(names) - 1 else "") + f"for (int64_t {n} = 0; {n} < {d}; ++{n})"
            blk = Block(cur.scope.child((n,)), head)
            cur.add(blk)
            cur = blk
        return cur

    def raw(self, r: Reduction) -> tuple[str, str]:
        """(C++ type, initial value) of a reduction's running value."""
        bdt = r.body.dt
        if r.kind in ("sum", "prod"):
            t = "double" if bdt == "f32" or r.dt == "f32" else "int64_t"
            return t, "0" if r.kind == "sum" else "1"
        if r.kind in ("any", "all"):
            return "bool", "false" if r.kind == "any" else "true"
        t = CTYPES[bdt]
        hi = "INFINITY" if bdt == "f32" else "INT64_MAX"
        return t, (f"(-{hi})" if bdt == "f32" else "INT64_MIN") if r.kind in ("max", "argmax") else hi

    def update(self, r: Reduction, v: str, flat: str, at: str, prefix: str = "a") -> str:
        a = f"{prefix}_{r.acc}{at}"
        if r.kind in ("argmax", "argmin"):
            cmp = ">" if r.kind == "argmax" else "<"
            bv, bi = f"bv_{r.acc}{at}", f"a_{r.acc}{at}"
            return f"{{ const bool u = {v} {cmp} {bv}; {bv} = u ? {v} : {bv}; {bi} = u ? {flat} : {bi}; }}"
        return {"sum": f"{a} += {v};", "prod": f"{a} *= {v};", "max": f"{a} = {v} > {a} ? {v} : {a};",
                "min": f"{a} = {v} < {a} ? {v} : {a};", "any": f"{a} = {a} || {v};",
                "all": f"{a} = {a} && {v};"}[r.kind]

    def size_params(self, pre: list[str]) -> list[tuple[str, bool, str]]:
        """Each size argument the kernel read: (C declaration, is it an integer, Python for its
        value in ``forward``; powers ``py_expr`` does not print become lines of ``pre``)."""
        out = []
        for expr, name in self.em.sizes.items():
            is_int = sympy.sympify(expr).is_integer is True
            out.append((f"{'int64_t' if is_int else 'double'} {name}", is_int, size_source(expr, pre, self.fn)))
        return out
