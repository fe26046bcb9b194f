"""Scalar expressions over a kernel's loop variables (:class:`E`) and the integer index
arithmetic that lowering builds them with (div/mod simplified by the variables' ranges).

An :class:`E` is one scalar expression::

    var   v=("o0", extent)      a loop index (int)          size  v=<sympy>   a runtime size (int)
    const v=1.5                 a literal                   load  v="buf"     a buffer at args[0]
    acc   v="r3"                a value the kernel already holds (GEMM accumulator, a reduction)
    <op>  args=(...)            an op of the table (:mod:`kforge.agents.expert.ir.ops`): a
                                pointwise op (``v`` its typed attributes, if any) or an index op
                                (iadd isub imul ifloordiv imod imin imax)
"""

from __future__ import annotations

import functools
from typing import Any

import sympy


class E:
    __slots__ = ("op", "args", "v", "dt", "_hash")

    def __init__(self, op: str, args: tuple[E, ...] = (), v: Any = None, dt: str = "f32") -> None:
        self.op, self.args, self.v, self.dt = op, args, v, dt
        self._hash = hash((op, args, v, dt))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, E) and self._hash == other._hash and self.op == other.op \
            and self.v == other.v and self.dt == other.dt and self.args == other.args

    def __repr__(self) -> str:
        if self.op == "var":
            return f"var:{self.v[0]}"
        if self.op in ("size", "const", "acc"):
            return f"{self.op}:{self.v}"
        return f"{self.op}{'[' + str(self.v) + ']' if self.v is not None else ''}({', '.join(map(repr, self.args))})"

    def walk(self) -> list[E]:
        seen: dict[E, None] = {}
        stack = [self]
        while stack:
            e = stack.pop()
            if e not in seen:
                seen[e] = None
                stack.extend(e.args)
        return list(seen)


def const(v: Any, dt: str = "i64") -> E:
    return E("const", v=v, dt=dt)


ZERO = const(0)


def var(name: str, extent: Any) -> E:
    """A loop variable ``0 <= name < extent`` (``v`` is ``(name, extent)``)."""
    return E("var", v=(name, sympy.sympify(extent)), dt="i64")


def size(expr: Any) -> E:
    expr = sympy.sympify(expr)
    return const(int(expr)) if expr.is_number else E("size", v=expr, dt="i64")


def iadd(a: E, b: E) -> E:
    if a.op == "const" and a.v == 0:
        return b
    if b.op == "const" and b.v == 0:
        return a
    if a.op == "const" and b.op == "const":
        return const(a.v + b.v)
    return E("iadd", (a, b), dt="i64")


def isub(a: E, b: E) -> E:
    if b.op == "const" and b.v == 0:
        return a
    return E("isub", (a, b), dt="i64")


def imul(a: E, b: E) -> E:
    for x, y in ((a, b), (b, a)):
        if x.op == "const" and x.v == 1:
            return y
        if x.op == "const" and x.v == 0:
            return ZERO
    if a.op == "const" and b.op == "const":
        return const(a.v * b.v)
    return E("imul", (a, b), dt="i64")


def ifloordiv(a: E, b: E) -> E:
    if b.op == "const" and b.v == 1:
        return a
    if a.op == "const" and a.v == 0:
        return ZERO
    split = _split(a, b)
    if split is not None:
        quot, rest = split
        if _fits(rest, b):
            return quot
    return E("ifloordiv", (a, b), dt="i64")


def imod(a: E, b: E) -> E:
    if b.op == "const" and b.v == 1:
        return ZERO
    split = _split(a, b)
    if split is not None and _fits(split[1], b):
        return split[1]
    return E("imod", (a, b), dt="i64")


def _terms(e: E) -> list[E]:
    return [*_terms(e.args[0]), *_terms(e.args[1])] if e.op == "iadd" else [e]


def _sum(terms: list[E]) -> E:
    total = ZERO
    for t in terms:
        total = iadd(total, t)
    return total


def _value_of(e: E) -> sympy.Expr | None:
    if e.op == "const" and not isinstance(e.v, bool | float):
        return sympy.Integer(e.v)
    if e.op == "size":
        return e.v
    return None


def _split(a: E, b: E) -> tuple[E, E] | None:
    """``a`` as ``b * quot + rest`` from its terms (multiples of ``b`` go to ``quot``)."""
    bv = _value_of(b)
    if bv is None:
        return None
    quot, rest = [], []
    for t in _terms(a):
        if t.op == "imul":
            for x, c in ((t.args[0], t.args[1]), (t.args[1], t.args[0])):
                cv = _value_of(c)
                if cv is not None:
                    ratio = sympy.simplify(cv / bv)
                    if ratio.is_Integer:
                        quot.append(imul(x, const(int(ratio))))
                        break
                    if _whole(ratio):  # a product of sizes (H*W*q over H*W): still a multiple
                        quot.append(imul(x, size(ratio)))
                        break
            else:
                rest.append(t)
        else:
            rest.append(t)
    return _sum(quot), _sum(rest)


def _whole(ratio: sympy.Expr) -> bool:
    """Is ``ratio`` (of two size expressions) a positive integer for every size: a product of
    integer symbols and a positive integer, no division left?"""
    if ratio.is_number or not ratio.is_Mul and not ratio.is_Symbol:
        return False
    num, den = sympy.fraction(sympy.cancel(ratio))
    return den == 1 and all((f.is_Symbol and f.is_integer) or (f.is_Integer and f > 0)
                            for f in sympy.Mul.make_args(num))


def bound(e: E) -> sympy.Expr | None:
    """An exclusive upper bound of a non-negative index expression, when one is known."""
    if e.op == "var":
        return e.v[1]
    if e.op == "const" and not isinstance(e.v, float):
        return sympy.Integer(int(e.v) + 1)
    if e.op == "iadd":
        a, b = bound(e.args[0]), bound(e.args[1])
        return None if a is None or b is None else a + b - 1
    if e.op == "imul":
        for x, c in ((e.args[0], e.args[1]), (e.args[1], e.args[0])):
            cv, bx = _value_of(c), bound(x)
            if cv is not None and bx is not None:
                return (bx - 1) * cv + 1
        return None
    if e.op == "imod":
        return _value_of(e.args[1])
    return None


def _fits(e: E, b: E) -> bool:
    """``0 <= e < b`` for every size (checked symbolically, else at two probe sizes)."""
    ub, bv = bound(e), _value_of(b)
    if ub is None or bv is None:
        return False
    if sizes_equal(ub, bv) or (ub.is_number and bv.is_number and ub <= bv):
        return True
    syms = ub.free_symbols | bv.free_symbols
    try:
        return all(bool(ub.subs({s: p for s in syms}) <= bv.subs({s: p for s in syms})) for p in (1 << 12, 1 << 20))
    except TypeError:
        return False


def sizes_equal(a: Any, b: Any) -> bool:
    a, b = sympy.sympify(a), sympy.sympify(b)
    return a == b or _equal(a, b)


@functools.lru_cache(maxsize=4096)
def _equal(a: sympy.Expr, b: sympy.Expr) -> bool:
    return sympy.expand(a - b) == 0


def strides(shape: tuple[Any, ...]) -> list[sympy.Expr]:
    out: list[sympy.Expr] = []
    acc: sympy.Expr = sympy.Integer(1)
    for s in reversed(shape):
        out.append(acc)
        acc = acc * s
    return list(reversed(out))


def linear(idx: tuple[E, ...], shape: tuple[Any, ...]) -> E:
    total = ZERO
    for i, st in zip(idx, strides(shape), strict=True):
        total = iadd(total, imul(i, size(st)))
    return total


def unflatten(flat: E, shape: tuple[Any, ...]) -> tuple[E, ...]:
    out = []
    st = strides(shape)
    for d, s in enumerate(shape):
        if sympy.sympify(s) == 1:
            out.append(ZERO)
            continue
        q = ifloordiv(flat, size(st[d]))
        out.append(q if d == 0 else imod(q, size(s)))
    return tuple(out)


_ORIGIN: dict[tuple[Any, ...], tuple[E, ...]] = {}  # (index, shape, back to) -> the index it came from


def reshape_index(idx: tuple[E, ...], out_shape: tuple[Any, ...], in_shape: tuple[Any, ...]) -> tuple[E, ...]:
    """The index into ``in_shape`` of element ``idx`` of its row-major reshape ``out_shape``.

    A reshape is a bijection of equal-size shapes, so reshaping an index back where it came
    from gives the original index (remembered here), whatever div/mod the way there took:
    a GroupNorm's ``[N, G, q*H*W]`` -> ``[N, G*q, H, W]`` -> ``[N, G, q*H*W]`` round trip."""
    back = _ORIGIN.get((idx, tuple(out_shape), tuple(in_shape)))
    if back is not None:
        return back
    result = _reshape_index(idx, out_shape, in_shape)
    if len(_ORIGIN) > 1 << 16:
        _ORIGIN.clear()
    _ORIGIN[(result, tuple(in_shape), tuple(out_shape))] = idx
    return result


def _reshape_index(idx: tuple[E, ...], out_shape: tuple[Any, ...], in_shape: tuple[Any, ...]) -> tuple[E, ...]:
    o = [(i, s) for i, s in zip(idx, out_shape, strict=True) if sympy.sympify(s) != 1]
    ins = [d for d, s in enumerate(in_shape) if sympy.sympify(s) != 1]
    result: list[E] = [ZERO] * len(in_shape)
    oi = ii = 0
    while oi < len(o) or ii < len(ins):
        og, ig = [o[oi]] if oi < len(o) else [], [ins[ii]] if ii < len(ins) else []
        oi += 1
        ii += 1
        po = sympy.Mul(*[s for _, s in og]) if og else sympy.Integer(1)
        pi = sympy.Mul(*[in_shape[d] for d in ig]) if ig else sympy.Integer(1)
        while not sizes_equal(po, pi):
            if (oi < len(o)) and (ii >= len(ins) or _smaller(po, pi)):
                og.append(o[oi])
                po = po * o[oi][1]
                oi += 1
            elif ii < len(ins):
                ig.append(ins[ii])
                pi = pi * in_shape[ins[ii]]
                ii += 1
            else:  # products never match symbolically: one flat group
                og += o[oi:]
                ig += ins[ii:]
                oi, ii = len(o), len(ins)
                break
        if len(og) == 1 and len(ig) == 1:
            result[ig[0]] = og[0][0]
            continue
        flat = linear(tuple(i for i, _ in og), tuple(s for _, s in og))
        sub = unflatten(flat, tuple(in_shape[d] for d in ig))
        for d, e in zip(ig, sub, strict=True):
            result[d] = e
    return tuple(result)


def _smaller(a: sympy.Expr, b: sympy.Expr) -> bool:
    """Is product ``a`` (so far) smaller than ``b``? Compared at a large probe value of
    every symbol (sizes are positive), so ``s`` < ``s * t`` and ``s // 16`` < ``s``."""
    probe = {sym: 1 << 20 for sym in (a.free_symbols | b.free_symbols)}
    try:
        return bool(a.subs(probe) < b.subs(probe))
    except TypeError:
        return True


def index_terms(e: E) -> list[E]:
    """The terms of a sum of index expressions."""
    return [*index_terms(e.args[0]), *index_terms(e.args[1])] if e.op == "iadd" else [e]


def affine(e: E, names: list[str]) -> tuple[dict[str, E], E] | None:
    """``e`` as ``offset + sum(coeff[v] * v)`` with coefficients free of the variables."""
    coeffs: dict[str, E] = {n: ZERO for n in names}

    def walk(x: E, scale: E) -> E | None:
        if x.op == "var":
            if x.v[0] not in coeffs:
                return None
            coeffs[x.v[0]] = iadd(coeffs[x.v[0]], scale)
            return ZERO
        if x.op in ("const", "size"):
            return imul(x, scale)
        if x.op == "iadd":
            a, b = walk(x.args[0], scale), walk(x.args[1], scale)
            return None if a is None or b is None else iadd(a, b)
        if x.op == "imul":
            a, b = x.args
            if not has_var(a):
                return walk(b, imul(scale, a))
            if not has_var(b):
                return walk(a, imul(scale, b))
        return None

    offset = walk(e, const(1))
    return None if offset is None else (coeffs, offset)


def has_var(e: E) -> bool:
    return any(x.op == "var" for x in e.walk())


def as_size(e: E) -> sympy.Expr:
    """An index expression free of loop variables (an operand's stride or offset) as the size
    expression it computes."""
    if e.op == "size":
        return sympy.sympify(e.v)
    if e.op == "const":
        return sympy.Integer(int(e.v))
    ops = {"iadd": lambda a, b: a + b, "isub": lambda a, b: a - b, "imul": lambda a, b: a * b}
    if e.op in ops:
        return ops[e.op](as_size(e.args[0]), as_size(e.args[1]))  # type: ignore[no-any-return]
    raise ValueError(f"{e} is not a size expression")
