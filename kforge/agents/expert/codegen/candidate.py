"""The parts of a generated candidate every backend shares: ``ModelNew`` and its ``forward``.

``ModelNew.__init__`` is the reference's ``__init__`` (its source, with KernelBench's
``super(Model, self).__init__()`` made ``super().__init__()``), so every parameter and
buffer has the reference's name, shape and seeded value for any init inputs. ``forward``:

1. reads every size symbol from the shape of the tensor it was traced from;
2. binds each placeholder buffer (a forward argument, made contiguous, or a state tensor);
3. allocates each temporary and output buffer (``torch.empty``: every element is stored by a
   kernel before it is read);
4. launches the kernels in order (the backend's lines), and returns the outputs.

Sizes are sympy expressions over the symbols; :func:`py_expr` prints them as Python.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Callable
from typing import Any

import sympy

from kforge.agents.expert.errors import UnsupportedError
from kforge.agents.expert.plan.kernels import Kernel, Program

TORCH_DTYPES = {"f32": "torch.float32", "i64": "torch.int64", "i32": "torch.int32", "bool": "torch.bool",
                "bf16": "torch.bfloat16", "f16": "torch.float16"}


def py_expr(expr: Any) -> str:
    """A sympy size expression as Python source over the symbols' names."""
    from torch.utils._sympy import functions as F

    e = sympy.sympify(expr)
    if isinstance(e, sympy.Symbol):
        return str(e)
    if isinstance(e, sympy.Integer):
        return str(int(e))
    if isinstance(e, sympy.Float | sympy.Rational) and e.is_number:
        return repr(float(e))
    args = [py_expr(a) for a in e.args]
    if isinstance(e, sympy.Add):
        return "(" + " + ".join(args) + ")"
    if isinstance(e, sympy.Mul):
        return "(" + " * ".join(args) + ")"
    if isinstance(e, sympy.Pow) and e.args[1].is_Integer:
        n = int(e.args[1])
        return f"({args[0]} ** {n})" if n >= 0 else f"(1.0 / ({args[0]} ** {-n}))"
    if isinstance(e, F.FloatPow | F.PowByNatural) or isinstance(e, sympy.Pow):
        return f"({args[0]} ** {args[1]})"
    if isinstance(e, F.FloorDiv):
        return f"({args[0]} // {args[1]})"
    if isinstance(e, F.CeilDiv):
        return f"(-((-{args[0]}) // {args[1]}))"
    if isinstance(e, F.ModularIndexing):
        return f"(({args[0]} // {args[1]}) % {args[2]})"
    if isinstance(e, F.Mod | F.PythonMod | sympy.Mod):
        return f"({args[0]} % {args[1]})"
    if isinstance(e, F.FloatTrueDiv | F.IntTrueDiv):
        return f"({args[0]} / {args[1]})"
    if isinstance(e, F.ToFloat):
        return f"float({args[0]})"
    if isinstance(e, F.TruncToInt | F.FloorToInt):
        return f"int({args[0]})"
    if isinstance(e, sympy.Max | F.Max):
        return f"max({', '.join(args)})"
    if isinstance(e, sympy.Min | F.Min):
        return f"min({', '.join(args)})"
    raise UnsupportedError(f"size expression {e} ({type(e).__name__})")


def reference_init(problem_source: str, fixed_init: dict[int, Any] | None = None,
                   keep_args: bool = False) -> tuple[list[str], str]:
    """The problem's import lines and ``Model.__init__`` (``def`` included), with
    ``super(Model, self)`` written ``super()`` so it initialises ``ModelNew``; with
    ``fixed_init`` (init inputs baked into the kernels), it ends by refusing other values; with
    ``keep_args``, it keeps its positional arguments as ``self._kf_init`` (sizes that only the
    constructor's arguments carry, such as a group count, are read from there)."""
    tree = ast.parse(problem_source)
    imports = [ast.get_source_segment(problem_source, n) or "" for n in tree.body
               if isinstance(n, ast.Import | ast.ImportFrom)]
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    for call in ast.walk(item):
                        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "super":
                            call.args = []
                    params = [a.arg for a in item.args.args[1:]]
                    star = item.args.vararg.arg if item.args.vararg else None
                    for i, want in sorted((fixed_init or {}).items()):
                        name = params[i] if i < len(params) else (f"{star}[{i - len(params)}]" if star else None)
                        if name is not None:
                            item.body.extend(ast.parse(
                                f"if {name} != {want!r}:\n    raise ValueError("
                                f"'this candidate was compiled for {name} = {want}, got ' + repr({name}))").body)
                    if keep_args:  # taken first: the body may rebind a name
                        packed = ", ".join([*params, *([f"*{star}"] if star else [])])
                        item.body.insert(0, ast.parse(f"_kf_init = ({packed}{',' if packed else ''})").body[0])
                        item.body.extend(ast.parse("self._kf_init = _kf_init").body)
                    return imports, ast.unparse(item) + "\n"
    return imports, "def __init__(self, *args, **kwargs):\n    super().__init__()\n"


def reference_support(problem_source: str) -> tuple[str, str]:
    """What the reference's ``__init__`` builds with, copied so ``ModelNew``'s copy of it runs:
    (the module's classes and functions that ``__init__`` reaches, by name, through
    each other, ``forward`` methods left out: here they only hold submodules, the kernels
    compute; ``Model``'s own methods other than ``__init__`` and ``forward``, such as
    KernelBench's ``_make_layer`` helpers, and its class attributes such as ResNet's
    ``expansion``, indented for the class)."""
    tree = ast.parse(problem_source)
    defs: dict[str, ast.ClassDef | ast.FunctionDef] = {}
    model: ast.ClassDef | None = None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            model = node
        elif isinstance(node, ast.ClassDef | ast.FunctionDef) and node.name not in ("get_inputs", "get_init_inputs"):
            defs[node.name] = node
    if model is None:
        return "", ""
    for cls in [d for d in defs.values() if isinstance(d, ast.ClassDef)]:
        cls.body = [item for item in cls.body
                    if not (isinstance(item, ast.FunctionDef) and item.name == "forward")] or [ast.Pass()]
    methods = [item for item in model.body if isinstance(item, ast.FunctionDef) and item.name != "forward"]

    def names(node: ast.AST) -> set[str]:
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}

    wanted: set[str] = set()
    todo = set().union(*(names(m) for m in methods)) if methods else set()
    while todo:
        name = todo.pop()
        if name in defs and name not in wanted:
            wanted.add(name)
            todo |= names(defs[name])
    support = "".join(f"{ast.unparse(d)}\n\n\n" for n, d in defs.items() if n in wanted)  # source order
    extra: list[ast.stmt] = [m for m in methods if m.name != "__init__"]
    extra += [item for item in model.body if isinstance(item, ast.Assign | ast.AnnAssign)]  # expansion = 4
    return support, "".join("\n" + textwrap.indent(ast.unparse(m), "    ") + "\n" for m in extra)


STATE_HELPER = '''def _state(module, name):
    """A parameter or buffer of ``module`` by its dotted state_dict name, contiguous."""
    owner, _, leaf = name.rpartition(".")
    return getattr(module.get_submodule(owner) if owner else module, leaf).detach().contiguous()
'''


def shape_guard(program: Program) -> list[str]:
    """Python lines that refuse tensors whose shape is not the program's (a size the capture
    specialised): a clear error instead of kernels reading past the end of a buffer."""
    lines = []
    for name in program.placeholders:
        buf = program.buffers[name]
        want = "(" + "".join(f"{py_expr(s)}, " for s in buf.shape) + ")"
        lines.append(f"if tuple({name}.shape) != {want}:")
        lines.append(f"    raise ValueError(f'{name}: shape {{tuple({name}.shape)}}, kernels built for {{{want}}}')")
    return lines


def forward_source(program: Program, arg_names: list[str], launch: Callable[[Kernel], list[str]],
                   bind: Callable[[str], str] = lambda e: e) -> str:
    """The body of ``ModelNew.forward`` (8-space indented lines)."""
    lines: list[str] = []
    ph_exprs: list[str] = []
    for name in program.placeholders:
        buf = program.buffers[name]
        if buf.kind == "input":
            arg = arg_names[program.inputs.index(buf.source)]
            if buf.shape == () and buf.dtype == "f32":
                lines.append(f"{name} = torch.as_tensor({arg}, dtype=torch.float32, device=_device)")
            else:
                lines.append(f"{name} = {bind(f'{arg}.contiguous()')}")
        else:
            lines.append(f"{name} = {bind(f'_state(self, {buf.source!r})')}")
        ph_exprs.append(name)
    for sym, (index, dim, scale) in sorted(program.sources.items(), key=lambda kv: str(kv[0])):
        lines.append(f"{sym} = {ph_exprs[index]}.shape[{dim}]" + (f" // {scale}" if scale != 1 else ""))
    for sym, index in sorted(program.init_sources.items(), key=lambda kv: str(kv[0])):
        at = f"[{index}]" if isinstance(index, int) else f"[{index[0]}][{index[1]}]"
        lines.append(f"{sym} = int(self._kf_init{at})")
    for sym, (a, b) in sorted(program.derived.items(), key=lambda kv: str(kv[0])):
        lines.append(f"{sym} = {a} // {b}")
    for buf in program.buffers.values():
        if buf.kind == "temp":
            shape = ", ".join(py_expr(s) for s in buf.shape)
            lines.append(f"{buf.name} = torch.empty(({shape}{',' if len(buf.shape) == 1 else ''}), "
                         f"dtype={TORCH_DTYPES[buf.stored]}, device=_device)")
    for kernel in program.kernels:
        lines.extend(launch(kernel))
    outs = ", ".join(program.outputs)
    lines.append(f"return ({outs},)" if program.returns_tuple and len(program.outputs) == 1
                 else f"return {outs}")
    return "\n".join(f"        {line}" for line in lines)


def input_device(program: Program) -> str:
    """``forward``'s device line: the device of its first tensor argument."""
    return "_device = next(a.device for a in (" + "".join(f"x{i}, " for i in range(len(program.inputs))) + \
        ") if isinstance(a, torch.Tensor))"


def model_new_class(program: Program, problem_source: str, launches: dict[str, list[str]],
              device_line: str) -> tuple[list[str], str]:
    """:func:`model_new_source` with each kernel's launch lines, the first kernel's preceded by
    the shape guard (a size the capture fixed: a clear error, not a fault)."""
    first = program.kernels[0].name if program.kernels else ""

    def launch(kernel: Kernel) -> list[str]:
        return (shape_guard(program) if kernel.name == first else []) + launches[kernel.name]

    return model_new_source(program, problem_source, launch, device_line)


def model_new_source(program: Program, problem_source: str, launch: Callable[[Kernel], list[str]],
                     device_line: str, bind: Callable[[str], str] = lambda e: e) -> tuple[list[str], str]:
    """(the problem's imports, the ``ModelNew`` class source)."""
    imports, init = reference_init(problem_source, program.fixed_init, keep_args=bool(program.init_sources))
    arg_names = [f"x{i}" for i in range(len(program.inputs))]
    head = f"    def forward(self, {', '.join(arg_names)}):\n        {device_line}\n"
    body = forward_source(program, arg_names, launch, bind)
    support, methods = reference_support(problem_source)
    return imports, (support + "class ModelNew(nn.Module):\n" + textwrap.indent(init, "    ") + methods
                     + "\n" + head + body + "\n")


def size_source(expr: Any, pre: list[str], prefix: str) -> str:
    """Python for a size expression; powers ``py_expr`` does not print (``FloatPow``: an
    attention scale ``1 / sqrt(d)``) become assignments in ``pre``, innermost first."""
    from torch.utils._sympy import functions as F

    e = sympy.sympify(expr)
    kinds = (F.FloatPow, F.PowByNatural)
    while True:
        inner = [x for x in e.atoms(*kinds) if not any(a.atoms(*kinds) for a in x.args)]
        if not inner:
            break
        x = inner[0]
        name = f"_{prefix}_pow{len(pre)}"
        pre.append(f"{name} = {py_expr(x.args[0])} ** {py_expr(x.args[1])}")
        e = e.xreplace({x: sympy.Symbol(name)})
    return py_expr(e)
