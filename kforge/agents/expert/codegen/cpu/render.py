"""The CPU backend: a :class:`~kforge.agents.expert.plan.kernels.Program` -> a candidate module (C++ / OpenMP).

The module follows ``refs/cpu``: the kernels are one C++ translation unit in a ``CPP_SOURCE``
raw string, built and loaded by :mod:`kforge.platforms.cpu_runtime`, called through ctypes
with raw pointers, sizes as int64 (a float-valued size expression, such as BatchNorm's
``n / (n - 1)``, as a double) and the thread count last. Every size is an argument computed
by ``ModelNew.forward`` from its tensors' shapes, so one candidate serves every size.

Loop shapes per kernel kind:

* pointwise: the flattened outer dims x chunks of the last dim in parallel, the last dim
  vectorised (``omp simd``);
* row: *row* mode (reduced dims innermost in memory): one outer row per iteration, each pass
  one vectorised loop with an OpenMP ``reduction`` clause (sums in double); *column* mode (the
  last outer dim is the contiguous one: a column sum, softmax over dim 1): blocks of
  ``col_block`` columns per iteration, accumulators per column, the columns vectorised;
  *flat* mode (no outer dim: a loss): the reduction itself is split over the threads;
* gemm: :mod:`.gemm`; scan: outer rows in parallel, a running value in double.
"""

from __future__ import annotations

from kforge.agents.expert.codegen.candidate import STATE_HELPER, model_new_class
from kforge.agents.expert.codegen.cpu.gemm import gemm_body, gemm_prelude
from kforge.agents.expert.codegen.cpu.ops import CPU_OPS, PRELUDE
from kforge.agents.expert.codegen.cstyle import CTYPES, Block, CKernel, Scope
from kforge.agents.expert.errors import UnsupportedError
from kforge.agents.expert.ir.ops import OPS
from kforge.agents.expert.plan.expr import E, linear, var
from kforge.agents.expert.plan.kernels import (
    Kernel,
    PointwiseKernel,
    Program,
    Reduction,
    RowKernel,
    ScanKernel,
    Store,
)
from kforge.agents.expert.plan.knobs import CpuKnobs

OMP_OP = {"sum": "+", "prod": "*", "max": "max", "min": "min", "any": "||", "all": "&&"}
HEADER = '"""KForge expert candidate for the cpu platform (generated: {summary}; knobs: {knobs})."""\n'
ENTRY_HELPER = '''_LIB = cpu_runtime.load_library(CPP_SOURCE)
_CTYPES = {"p": ctypes.c_void_p, "i": ctypes.c_int64, "d": ctypes.c_double}


def _entry(name, signature):
    """The kernel ``name``; one letter per argument: pointer, int64, double."""
    fn = _LIB[name]
    fn.argtypes = [_CTYPES[c] for c in signature]
    fn.restype = None
    return fn
'''


class KernelRender(CKernel):
    """The C++ of one kernel and how ``forward`` launches it."""

    def __init__(self, kernel: Kernel, program: Program, knobs: CpuKnobs) -> None:
        super().__init__(kernel, program, CPU_OPS[knobs.fast])
        self.kn = knobs

    def store(self, s: Store, scope: Scope) -> str:
        return super().store(Store(s.buffer, s.index, self.reciprocal(s.value, scope)), scope)

    def par(self, work: str, clauses: str = "") -> str:
        return (f"#pragma omp parallel for num_threads(nthreads) schedule(static){clauses} "
                f"if({work} > {self.kn.par_min})\n")

    # ---------------------------------------------------------------- kinds
    def body(self) -> str:
        k = self.k
        if k.kind == "gemm":
            return "{\n" + gemm_body(k, self.p, self.em, self.kn) + "}"  # type: ignore[arg-type]
        build = {"pointwise": self.pointwise, "row": self.row, "scan": self.scan}[k.kind]
        return build(k).render(0)  # type: ignore[operator]

    def pointwise(self, k: PointwiseKernel) -> Block:
        root = Block(Scope(None))
        names = [f"p{i}" for i in range(len(k.space))]
        dims = [self.dim(s) for s in k.space]
        inner = root
        if names:
            ch = self.kn.chunk
            root.scope.defs.append(f"const int64_t P = {self.prod(dims[:-1])}, D = {dims[-1]}, "
                                   f"NCH = (D + {ch} - 1) / {ch};")
            outer = Block(root.scope.child(tuple(names[:-1])), self.par("P * D") + "for (int64_t q = 0; q < P * NCH; ++q)")
            outer.scope.defs.append(f"const int64_t qo = q / NCH, c0 = (q % NCH) * {ch}, c1 = std::min(D, c0 + {ch});")
            outer.scope.defs += self.decode("qo", names[:-1], dims[:-1])
            last = names[-1]
            inner = Block(outer.scope.child((last,)), f"#pragma omp simd\nfor (int64_t {last} = c0; {last} < c1; ++{last})")
            root.add(outer)
            outer.add(inner)
        for s in k.stores:
            inner.add(self.store(s, inner.scope))
        return root

    def mode(self, k: RowKernel) -> str:
        if not k.outer:
            return "flat"
        ol, rl = f"o{len(k.outer) - 1}", f"r{len(k.red) - 1}"
        unit_o = unit_r = False
        for r in k.reductions:
            for e in r.body.walk():
                if e.op == "load":
                    terms = _terms(e.args[0])
                    unit_o |= any(t.op == "var" and t.v[0] == ol for t in terms)
                    unit_r |= any(t.op == "var" and t.v[0] == rl for t in terms)
        if unit_o and not unit_r:
            return "column"
        if unit_r:
            return "row"
        return "row" if k.red_inner else "column"

    def declare(self, r: Reduction, size: str) -> list[str]:
        t, init = self.raw(r)
        if r.kind in ("argmax", "argmin"):
            decl = [(t, f"bv_{r.acc}", init), ("int64_t", f"a_{r.acc}", "0")]
        else:
            decl = [(t, f"a_{r.acc}", init)]
        if not size:
            return [f"{ty} {n} = {v};" for ty, n, v in decl]
        return [f"{ty} {n}[{size}]; for (int64_t j = 0; j < jn; ++j) {n}[j] = {v};" for ty, n, v in decl]

    def row(self, k: RowKernel) -> Block:
        mode = self.mode(k)
        root = Block(Scope(None))
        on = [f"o{i}" for i in range(len(k.outer))]
        od = [self.dim(s) for s in k.outer]
        rn = [f"r{i}" for i in range(len(k.red))] or ["rz"]
        rd = [self.dim(s) for s in k.red] or ["((int64_t)1)"]
        rvars = tuple(var(f"r{i}", s) for i, s in enumerate(k.red))
        flat_e = linear(rvars, k.red) if k.red else None
        cb, ch = self.kn.col_block, self.kn.chunk
        lead = on[:-1] if mode == "column" else on
        root.scope.defs.append(f"const int64_t R = {self.prod(rd)};")
        if mode == "flat":
            cur = root
            root.scope.defs.append(f"const int64_t RP = {self.prod(rd[:-1])}, RL = {rd[-1]}, NCH = (RL + {ch} - 1) / {ch};")
        elif mode == "row":
            root.scope.defs.append(f"const int64_t P = {self.prod(od)};")
            cur = Block(root.scope.child(tuple(lead)), self.par("P * R") + "for (int64_t q = 0; q < P; ++q)")
            cur.scope.defs += self.decode("q", on, od)
            root.add(cur)
        else:
            root.scope.defs.append(f"const int64_t P = {self.prod(od[:-1])}, DL = {od[-1]}, NB = (DL + {cb} - 1) / {cb};")
            cur = Block(root.scope.child(tuple(lead)), self.par("P * DL * R") + "for (int64_t q = 0; q < P * NB; ++q)")
            cur.scope.defs.append(f"const int64_t qo = q / NB, j0 = (q % NB) * {cb}, jn = std::min((int64_t){cb}, DL - j0);")
            cur.scope.defs += self.decode("qo", lead, od[:-1])
            root.add(cur)

        def loops(parent: Block, clauses: str, seq: bool) -> Block:
            """The loop nest of one pass over the reduced dims; returns the innermost body."""
            if mode == "flat":
                head = "" if seq else self.par("RP * RL", clauses)
                outer = Block(parent.scope.child(tuple(rn[:-1])), head + "for (int64_t q = 0; q < RP * NCH; ++q)")
                outer.scope.defs.append(f"const int64_t qo = q / NCH, c0 = (q % NCH) * {ch}, c1 = std::min(RL, c0 + {ch});")
                outer.scope.defs += self.decode("qo", rn[:-1], rd[:-1])
                parent.add(outer)
                simd = "" if seq else f"#pragma omp simd{clauses}\n"
                inner = Block(outer.scope.child((rn[-1],)), f"{simd}for (int64_t {rn[-1]} = c0; {rn[-1]} < c1; ++{rn[-1]})")
                outer.add(inner)
                return inner
            if mode == "row" and part:  # f32 sums per chunk of the last reduced dim
                body = self.nest(parent, rn[:-1], rd[:-1], "")
                chunk = Block(body.scope.child(), f"for (int64_t c0 = 0; c0 < {rd[-1]}; c0 += {ch})")
                chunk.scope.defs.append(f"const int64_t c1 = std::min({rd[-1]}, c0 + {ch});")
                body.add(chunk)
                chunk.items += [f"float f_{r.acc} = 0.0f;" for r in part]
                simd = "" if seq else f"#pragma omp simd{clauses}\n"
                inner = Block(chunk.scope.child((rn[-1],)), f"{simd}for (int64_t {rn[-1]} = c0; {rn[-1]} < c1; ++{rn[-1]})")
                chunk.add(inner)
                chunk.items += [f"a_{r.acc} += f_{r.acc};" for r in part]
                return inner
            if mode == "row":
                return self.nest(parent, rn, rd, "" if seq else f"#pragma omp simd{clauses}\n")
            body = self.nest(parent, rn, rd, "")
            col = Block(body.scope.child((on[-1],)), f"#pragma omp simd\nfor (int64_t {on[-1]} = j0; {on[-1]} < j0 + jn; ++{on[-1]})")
            body.add(col)
            return col

        at = f"[{on[-1]} - j0]" if mode == "column" else ""
        cache = self.row_cache(k) if mode == "row" and k.red else []
        # one kept value and one store of it into an f32 buffer the kernel never reads: the
        # output row itself is the cache (written in the last pass, scaled in place by the
        # store), so the output's first touch overlaps the transcendentals instead of a pure
        # streaming pass (softmax, outputs held as the timed workers hold them: 0.43 against
        # torch's 0.48 ms, where a scratch row gave 0.47 against 0.47)
        in_out = self.output_as_cache(k) if len(cache) == 1 else None
        for i, _ in enumerate(cache if in_out is None else []):
            cur.add(f"static thread_local std::vector<float> kf_rc{i}; if ((int64_t)kf_rc{i}.size() < R) kf_rc{i}.resize(R);\n"
                    f"float* __restrict rc{i} = kf_rc{i}.data();")
        part: list[Reduction] = []
        for pass_no in range(1, k.passes + 1):
            reds = [r for r in k.reductions if r.pass_no == pass_no]
            seq = any(r.kind in ("argmax", "argmin") for r in reds) and mode != "column"
            part = [r for r in reds if mode == "row" and r.kind == "sum" and r.body.dt == "f32" and r.dt == "f32"]
            clauses = "" if mode == "column" else "".join(
                f" reduction({OMP_OP[r.kind]}:{'f' if r in part else 'a'}_{r.acc})" for r in reds if r.kind in OMP_OP)
            for r in reds:
                for line in self.declare(r, str(cb) if mode == "column" else ""):
                    cur.add(line)
            inner = loops(cur, clauses, seq)
            flat = self.em.expr(flat_e, inner.scope) if flat_e is not None else "((int64_t)0)"
            for r in reds:
                body_e = self.reciprocal(r.body, inner.scope)
                inner.add(self.update(r, self.em.expr(body_e, inner.scope), flat, at, "f" if r in part else "a"))
            if pass_no == k.passes:
                for i, e in enumerate(cache):
                    slot = f"rc{i}[{flat}]" if in_out is None else self.slot(in_out, inner.scope)
                    inner.add(f"{slot} = {self.em.expr(self.reciprocal(e, inner.scope), inner.scope)};")
            for r in reds:
                value = f"a_{r.acc}{at}"
                self.em.accs[r.acc] = (f"(({CTYPES[r.dt]}){value})", frozenset({on[-1]}) if mode == "column" else frozenset())
            nxt = Block(cur.scope.child((), tuple(r.acc for r in reds)))
            cur.add(nxt)
            cur = nxt
        if k.outer_stores:
            target = cur
            if mode == "column":
                target = Block(cur.scope.child((on[-1],)), f"#pragma omp simd\nfor (int64_t {on[-1]} = j0; {on[-1]} < j0 + jn; ++{on[-1]})")
                cur.add(target)
            for s in k.outer_stores:
                target.add(self.store(s, target.scope))
        if k.full_stores:
            inner = loops(cur, "", False) if mode != "row" else self.nest(cur, rn, rd, "#pragma omp simd\n")
            if cache:
                flat = self.em.expr(flat_e, inner.scope)
                for i, e in enumerate(cache):
                    kept = self.reciprocal(e, inner.scope)
                    name = f"t{self.em.count}"
                    self.em.count += 1
                    slot = f"rc{i}[{flat}]" if in_out is None else self.slot(in_out, inner.scope)
                    inner.scope.defs.append(f"const float {name} = {slot};")
                    inner.scope.memo[kept] = name
            for s in k.full_stores:
                inner.add(self.store(s, inner.scope))
        return root

    def output_as_cache(self, k: RowKernel) -> Store | None:
        """The row's one full store when its buffer can hold the kept value between the last
        pass and the store: f32, and read nowhere in the kernel (an aliased input would be
        overwritten before its last read)."""
        if len(k.full_stores) != 1:
            return None
        s = k.full_stores[0]
        if self.p.buffers[s.buffer].dtype != "f32":
            return None
        exprs = [r.body for r in k.reductions] + [t.value for t in (*k.full_stores, *k.outer_stores)]
        if any(x.op == "load" and x.v == s.buffer for e in exprs for x in e.walk()):
            return None
        return s

    def row_cache(self, k: RowKernel) -> list[E]:
        """The values the full stores recompute from the last pass that cost a transcendental
        an element (softmax's ``exp(x - max)``): the last pass keeps them in a row of scratch
        (``rc<i>``, per thread, in L1 / L2 for rows up to tens of thousands) that the stores
        read instead."""
        inside: set[E] = set()
        for r in k.reductions:
            if r.pass_no == k.passes:
                inside.update(r.body.walk())
        reduced = {f"r{i}" for i in range(len(k.red))}  # the loop variables row() names them
        found: list[E] = []

        def visit(e: E) -> None:
            if e in inside and e.dt == "f32" and _costly(e) and any(x.op == "var" and x.v[0] in reduced for x in e.walk()):
                if e not in found:
                    found.append(e)
                return
            for a in e.args:
                visit(a)

        for s in k.full_stores:
            visit(s.value)
        return found

    def reciprocal(self, e: E, scope: Scope) -> E:
        """``e`` with every f32 division of a value the innermost loop changes by one it does not
        change made a multiply by its reciprocal (hoisted out of the loop by the emitter): a vector division
        costs ~10x a multiply, and the two differ by at most an ulp of the quotient."""
        memo: dict[E, E] = {}

        def go(x: E) -> E:
            if x in memo:
                return memo[x]
            args = tuple(go(a) for a in x.args)
            out = x if args == x.args else E(x.op, args, x.v, x.dt)
            if out.op == "div" and out.dt == "f32" and args[1].dt == "f32" and scope.parent is not None:
                outer = scope.parent
                if not _within(self.em.needs(args[0]), outer) and _within(self.em.needs(args[1]), outer):
                    out = E("mul", (args[0], E("reciprocal", (args[1],), None, "f32")), None, "f32")
            memo[x] = out
            return out

        return go(e)

    def scan(self, k: ScanKernel) -> Block:
        root = Block(Scope(None))
        on = [f"o{i}" for i in range(len(k.outer))]
        od = [self.dim(s) for s in k.outer]
        root.scope.defs.append(f"const int64_t P = {self.prod(od)}, L = {self.dim(k.length)};")
        row = Block(root.scope.child(tuple(on)), self.par("P * L") + "for (int64_t q = 0; q < P; ++q)")
        row.scope.defs += self.decode("q", on, od)
        root.add(row)
        t = "double" if k.body.dt == "f32" else "int64_t"
        row.add(f"{t} run = {0 if k.op == 'sum' else 1};")
        loop = Block(row.scope.child(("s",)), "for (int64_t s = 0; s < L; ++s)")
        row.add(loop)
        v = self.em.expr(k.body, loop.scope)
        loop.add(f"run {'+' if k.op == 'sum' else '*'}= {v};")
        st = Block(loop.scope.child((), ("scan",)))
        loop.add(st)
        self.em.accs["scan"] = (f"(({CTYPES[k.body.dt]})run)", frozenset({"s"}))
        st.add(self.store(k.store, st.scope))
        return root

    # ---------------------------------------------------------------- assembly
    def render(self) -> tuple[str, str, list[str]]:
        """(C++ function, ctypes signature, Python launch lines)."""
        body = self.body()
        params = [f"{CTYPES[self.p.buffers[b].dtype]}* __restrict {ptr}" for b, ptr in self.em.buffers.items()]
        sig = "p" * len(params)
        args = [f"{b}.data_ptr()" for b in self.em.buffers]
        pre: list[str] = []
        for decl, is_int, arg in self.size_params(pre):
            params.append(decl)
            sig += "i" if is_int else "d"
            args.append(arg)
        params.append("int64_t nthreads")
        sig += "i"
        args.append("_nt")
        code = f'extern "C" void {self.fn}({", ".join(params)})\n{body}\n'
        launch = [*pre, f"cpu_runtime.launch(_K[{self.fn!r}], {self.fn!r}, {', '.join(args)})"]
        return code, sig, launch


def _within(needs: tuple[frozenset[str], frozenset[str]], scope: Scope) -> bool:
    return needs[0] <= scope.vars and needs[1] <= scope.accs


def _costly(e: E) -> bool:
    return any(OPS[x.op].transcendental for x in e.walk() if x.op in OPS)


def _terms(e: E) -> list[E]:
    return [*_terms(e.args[0]), *_terms(e.args[1])] if e.op == "iadd" else [e]


def render_cpu(program: Program, kn: CpuKnobs, problem_source: str) -> str:
    """A complete candidate module (``CPP_SOURCE`` + ``ModelNew``) for ``program``."""
    funcs: list[str] = []
    entries: list[str] = []
    launches: dict[str, list[str]] = {}
    for kernel in program.kernels:
        code, sig, lines = KernelRender(kernel, program, kn).render()
        funcs.append(code)
        entries.append(f"    {'kf_' + kernel.name!r}: _entry({'kf_' + kernel.name!r}, {sig!r}),")
        launches[kernel.name] = lines
    prelude = PRELUDE + (gemm_prelude(kn) if any(k.kind == "gemm" for k in program.kernels) else "")
    cpp = prelude + "\n" + "\n".join(funcs)
    if '"""' in cpp:  # pragma: no cover - nothing we emit has one
        raise UnsupportedError("generated C++ contains a triple quote")

    imports, cls = model_new_class(program, problem_source, launches, "_device = torch.device('cpu')\n        _nt = cpu_runtime.threads()")
    std = ["import ctypes", "import torch", "import torch.nn as nn"]
    head = "\n".join(dict.fromkeys([*std, *imports]))
    return (HEADER.format(summary=program.summary(), knobs=kn.describe()) + "\n" + head
            + "\n\nfrom kforge.platforms import cpu_runtime\n\n"
            + f'CPP_SOURCE = r"""{cpp}"""\n\n' + ENTRY_HELPER
            + "\n\n_K = {\n" + "\n".join(entries) + "\n}\n\n\n" + STATE_HELPER + "\n\n" + cls)


__all__ = ["render_cpu"]
