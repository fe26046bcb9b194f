"""Index lowering: the value of any IR node at a symbolic index, as a scalar expression tree.

An :class:`E` is one scalar expression over the loop variables of a kernel::

    var   v="o0"            a loop index (int)          size  v=<sympy>   a runtime size (int)
    const v=1.5             a literal                   load  v="buf"     a buffer at args[0]
    acc   v="r3"            a value the kernel already holds (GEMM accumulator, a reduction)
    <op>  args=(...)        a pointwise op of :mod:`.ir` (also iadd imul ifloordiv imod imin imax
                            on integer indices)

:func:`Lowerer.value` follows views, broadcasts and pointwise ops down to the nodes that are
*materialised* (held in a buffer): views become index arithmetic (a reshape groups dimensions
whose sizes match, so an unsqueeze or a flatten costs nothing), pointwise ops are inlined.
A kernel hook can claim a node first (``claim``): the GEMM epilogue claims its matmul at the
tile's own index, a row kernel its reductions at the current row; a claim at any other index
raises :class:`NotFusable`, which tells the planner to materialise instead.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import sympy

from kforge.agents.expert.errors import NotFusable, UnsupportedError
from kforge.agents.expert.ir.graph import COMPARISONS, Node, Scalar


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


Claim = Callable[[Node, tuple[E, ...]], E | None]


class Lowerer:
    """``value(node, idx)`` with memoisation; ``buffers`` maps materialised nodes to names."""

    def __init__(self, buffers: dict[Node, str], claim: Claim | None = None) -> None:
        self.buffers = buffers
        self.claim = claim
        self.memo: dict[tuple[int, tuple[E, ...]], E] = {}
        self.loads: dict[str, Node] = {}

    def value(self, node: Node, idx: tuple[E, ...]) -> E:
        key = (id(node), idx)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = self._value(node, idx)
        return hit

    def scalar(self, s: Scalar, dt: str) -> E:
        v = sympy.sympify(s.value) if not isinstance(s.value, bool) else s.value
        if isinstance(v, sympy.Expr) and not v.is_number:
            e = E("size", v=_plain(v), dt="i64")
            return E("cast", (e,), dt=dt) if dt != "i64" else e
        if isinstance(v, bool):
            return const(v, "bool")
        num = float(v) if dt == "f32" else int(v)
        return const(num, dt)

    def operand(self, a: Node | Scalar, node: Node, idx: tuple[E, ...], dt: str) -> E:
        if isinstance(a, Scalar):
            return self.scalar(a, dt)
        rank = len(a.shape)
        n = len(node.shape)
        sub = tuple(ZERO if sympy.sympify(a.shape[j]) == 1 else idx[n - rank + j] for j in range(rank))
        e = self.value(a, sub)
        return e if e.dt == dt else E("cast", (e,), dt=dt)

    def _value(self, node: Node, idx: tuple[E, ...]) -> E:
        if self.claim is not None:
            claimed = self.claim(node, idx)
            if claimed is not None:
                return claimed
        if node in self.buffers:
            name = self.buffers[node]
            self.loads[name] = node
            return E("load", (linear(idx, node.shape),), v=name, dt=node.dtype)
        op = node.op
        if op == "const":
            return self.scalar(Scalar(node.attrs["value"], node.dtype), node.dtype)
        if op == "iota":
            e = iadd(size(node.attrs["start"]), imul(idx[0], size(node.attrs["step"])))
            return e if node.dtype == "i64" else E("cast", (e,), dt=node.dtype)
        if op == "view":
            (x,) = node.tensors
            return self.value(x, reshape_index(idx, node.shape, x.shape))
        if op == "permute":
            (x,) = node.tensors
            sub = [ZERO] * len(idx)
            for j, d in enumerate(node.attrs["dims"]):
                sub[d] = idx[j]
            return self.value(x, tuple(sub))
        if op == "broadcast":
            (x,) = node.tensors
            bd = node.attrs["bdims"]
            return self.value(x, tuple(ZERO if sympy.sympify(x.shape[j]) == 1 else idx[bd[j]] for j in range(len(x.shape))))
        if op == "slice":
            (x,) = node.tensors
            d = node.attrs["dim"]
            sub = list(idx)
            sub[d] = iadd(size(node.attrs["start"]), imul(idx[d], const(node.attrs["step"])))
            return self.value(x, tuple(sub))
        if op == "unfold":  # window j of position i along dim: element i * step + j
            (x,) = node.tensors
            d = node.attrs["dim"]
            sub = list(idx[:-1])
            sub[d] = iadd(imul(idx[d], const(node.attrs["step"])), idx[-1])
            return self.value(x, tuple(sub))
        if op == "select":
            (x,) = node.tensors
            d = node.attrs["dim"]
            return self.value(x, (*idx[:d], size(node.attrs["index"]), *idx[d:]))
        if op == "flip":
            (x,) = node.tensors
            sub = list(idx)
            for d in node.attrs["dims"]:
                sub[d] = isub(isub(size(node.shape[d]), const(1)), idx[d])
            return self.value(x, tuple(sub))
        if op == "cat":
            return self._cat(node, idx)
        if op == "pad":
            return self._pad(node, idx)
        if op == "gather":
            x, index = node.tensors
            d = node.attrs["dim"]
            sub = list(idx)
            sub[d] = self.value(index, idx)
            if sub[d].dt != "i64":
                sub[d] = E("cast", (sub[d],), dt="i64")
            return self.value(x, tuple(sub))
        if op in ("reduce", "scan", "matmul", "pool", "input", "param"):
            raise NotFusable(f"{node.name} ({op}) is not materialised")
        return self._pointwise(node, idx)

    def _pointwise(self, node: Node, idx: tuple[E, ...]) -> E:
        op = node.op
        if op in COMPARISONS:
            dts = [a.dtype for a in node.inputs if isinstance(a, Node | Scalar)]
            cdt = "f32" if "f32" in dts else ("bool" if op.startswith("logical") or all(d == "bool" for d in dts) else "i64")
        elif op == "where":
            cdt = node.dtype
        else:
            cdt = node.dtype
        args = []
        for i, a in enumerate(node.inputs):
            want = "bool" if (op == "where" and i == 0) else cdt
            args.append(self.operand(a, node, idx, want))
        attrs = node.attrs
        v: Any = None
        if op == "gelu":
            v = attrs.get("approximate", "none")
        elif op == "leaky_relu":
            v = attrs["slope"]
        elif op == "elu":
            v = (attrs["alpha"], attrs["scale"], attrs["input_scale"])
        elif op == "clamp":
            v = (attrs.get("min"), attrs.get("max"))
        if op == "cast":
            return args[0] if args[0].dt == node.dtype else E("cast", (args[0],), dt=node.dtype)
        return E(op, tuple(args), v=v, dt=node.dtype)

    def _cat(self, node: Node, idx: tuple[E, ...]) -> E:
        d = node.attrs["dim"]
        offset: Any = sympy.Integer(0)
        pieces: list[tuple[E, E]] = []
        for part in node.tensors:
            hi = offset + part.shape[d]
            local = E("imax", (E("imin", (isub(idx[d], size(offset)), size(part.shape[d] - 1)), dt="i64"), ZERO), dt="i64")
            sub = (*idx[:d], local, *idx[d + 1:])
            val = self.value(part, tuple(sub))
            pieces.append((E("lt", (idx[d], size(hi)), dt="bool"), val if val.dt == node.dtype else E("cast", (val,), dt=node.dtype)))
            offset = hi
        result = pieces[-1][1]
        for cond, val in reversed(pieces[:-1]):
            result = E("where", (cond, val, result), dt=node.dtype)
        return result

    def _pad(self, node: Node, idx: tuple[E, ...]) -> E:
        (x,) = node.tensors
        pads = node.attrs["pads"]
        sub = list(idx)
        valid: E | None = None
        for k in range(len(pads) // 2):
            d = len(idx) - 1 - k
            lo = pads[2 * k]
            if lo == 0 and pads[2 * k + 1] == 0:
                continue
            raw = isub(idx[d], const(lo))
            ok = E("logical_and", (E("ge", (raw, ZERO), dt="bool"), E("lt", (raw, size(x.shape[d])), dt="bool")), dt="bool")
            valid = ok if valid is None else E("logical_and", (valid, ok), dt="bool")
            sub[d] = E("imax", (E("imin", (raw, size(x.shape[d] - 1)), dt="i64"), ZERO), dt="i64")
        val = self.value(x, tuple(sub))
        if valid is None:
            return val
        return E("where", (valid, val, const(float(node.attrs["value"]), node.dtype)), dt=node.dtype)


def _plain(expr: sympy.Expr) -> sympy.Expr:
    """Drop ``ToFloat`` wrappers (kernels cast sizes themselves)."""
    from torch.utils._sympy.functions import ToFloat

    return expr.replace(lambda e: isinstance(e, ToFloat), lambda e: e.args[0])


def check_supported(node: Node) -> None:
    if node.op == "pool" and node.attrs.get("ceil_mode"):
        raise UnsupportedError("pooling with ceil_mode=True")
