"""Cut an exported forward into regions: what one cell of the pipeline makes a kernel of.

    1. every operation is keyed by the module it ran in, at a depth: the model's children first
    2. a group of consecutive operations with one key that holds more than ``MAX_HEAVY`` heavy
       ops (GEMMs, convolutions, attention, recurrences) is keyed one level deeper, into its
       child modules and the runs of its own operations between them
    3. consecutive groups merge while at most one of them holds heavy ops and together they
       hold no more than ``MAX_HEAVY``: a convolution and the BatchNorm, activation and pooling
       modules after it are one region (its epilogue), a LayerNorm joins the projection after it
    4. a group that reads nothing from outside itself (constants the forward makes) joins the
       group after it; a value made from nothing but constants and the model's own tensors that
       a later group writes in place (a decode step's cache counters, a sliding window's copy)
       is made in that group: no region writes an input it is given
    5. ``torch.fx``'s ``split_module`` makes each group a submodule; the parent graph calls
       them in order and hands them their activations, parameters and buffers

Consecutive groups in graph order are convex (a group reads only earlier groups' values), so
the split never reorders work. A region's digest is its code with its inputs' shapes and
dtypes: regions with one digest (every layer of a stack) are one cell.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx.passes.split_module import split_module

MAX_HEAVY = 4
HEAVY = ("conv", "linear", "mm", "bmm", "matmul", "addmm", "baddbmm", "einsum", "scaled_dot_product", "lstm",
         "gru", "rnn", "_convolution", "embedding_bag")


def is_heavy(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    name = str(getattr(node.target, "__name__", node.target)).split(".")[0]
    return name.startswith(HEAVY)


def _stack(node: torch.fx.Node) -> list[str]:
    return [str(v[0]) for v in (node.meta.get("nn_module_stack") or {}).values()]


def _key(node: torch.fx.Node, depth: int) -> str:
    stack = _stack(node)
    if len(stack) > depth:
        return stack[depth]
    return (stack[-1] if stack else "") + "::own"


def _runs(nodes: list[torch.fx.Node], key: Callable[[torch.fx.Node], str]) -> list[list[torch.fx.Node]]:
    runs: list[list[torch.fx.Node]] = []
    last = None
    for node in nodes:
        k = key(node)
        if not runs or k != last:
            runs.append([])
            last = k
        runs[-1].append(node)
    return runs


def _label(stacks: list[list[str]]) -> str:
    """The deepest module all of a region's operations ran in, and its children they ran in;
    operations of the model's own forward (a decode step's counters, made again where they are
    written) do not pull the label up to the model."""
    stacks = [s for s in stacks if any(s)] or stacks  # the model itself is the path ""
    common: list[str] = []
    for level in zip(*stacks, strict=False):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    top = common[-1] if common else ""
    children = sorted({s[len(common)] for s in stacks if len(s) > len(common)})
    inner = ", ".join(c.removeprefix(top + ".") for c in children[:4]) + ("..." if len(children) > 4 else "")
    return f"{top or '(model)'}" + (f": {inner}" if inner else "")


def _heavy(group: list[torch.fx.Node]) -> int:
    return sum(is_heavy(n) for n in group)


def groups_of(nodes: list[torch.fx.Node], depth: int = 1) -> list[list[torch.fx.Node]]:
    """Steps 1 to 3 of the module docstring. A module refined into its children comes back as
    a sealed run of groups: merging happens among siblings only, never across a refined
    module's edge, so every layer of a stack is cut alike (its norm does not join the layer
    before)."""
    out: list[list[torch.fx.Node]] = []
    pending: list[list[torch.fx.Node]] = []  # unrefined siblings, merged before they are kept
    for group in _runs(nodes, lambda n: _key(n, depth)):
        deeper = any(len(_stack(n)) > depth + 1 for n in group)
        if _heavy(group) > MAX_HEAVY and deeper:
            out += merged(pending)
            pending = []
            out += groups_of(group, depth + 1)
        else:
            pending.append(group)
    return out + merged(pending)


def sourceless_folded(groups: list[list[torch.fx.Node]]) -> list[list[torch.fx.Node]]:
    """A group that reads no activation from outside itself (constants a forward makes: a
    decode step's position, ``torch.full``; copies of the model's buffers: a sliding window's
    cache rolled on a copy) joins the group after it (the last, the one before): a region
    without inputs is no problem of its own, and a copy made in one region and written in place
    in the next would be an input its region changes."""
    out: list[list[torch.fx.Node]] = []
    carry: list[torch.fx.Node] = []
    for group in groups:
        members = set(group)
        if not any(isinstance(a, torch.fx.Node) and a not in members and a.op != "get_attr"
                   for n in group for a in n.all_input_nodes):
            carry += group
            continue
        out.append(carry + group)
        carry = []
    if carry:
        if not out:
            return [carry]
        out[-1] = out[-1] + carry
    return out


def written(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The arguments ``node`` writes in place (its op's schema marks them ``Tensor(a!)``)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return []
    return [a for a, arg in zip(node.args, schema.arguments, strict=False)  # trailing defaults unpassed
            if isinstance(a, torch.fx.Node) and arg.alias_info is not None and arg.alias_info.is_write]


def _made_of_constants(node: torch.fx.Node) -> list[torch.fx.Node] | None:
    """``node`` and what it is made from, in graph order, when that reads no input and none of
    the model's tensors (``torch.full``, ``arange`` and conversions of them), else None."""
    chain: dict[torch.fx.Node, None] = {}

    def visit(n: torch.fx.Node) -> bool:
        if n.op != "call_function":
            return False
        if n not in chain:
            if not all(visit(a) for a in n.all_input_nodes):
                return False
            chain[n] = None
        return True

    return list(chain) if visit(node) else None


def made_where_written(groups: list[list[torch.fx.Node]]) -> list[list[torch.fx.Node]]:
    """Step 4's second half. A value a group writes in place but an earlier group made is made
    again in the writing group, just before its first use there, when it is made of constants
    (a decode step's cache counter, which the causal mask reads before the attention adds to
    it); a copy of the model's own tensors that only the writing group uses moves there (a
    sliding window's rolled copy). Either reads nothing the group lacks, so the graph stays in
    a topological order; split_module emits a submodule where its first node stands."""
    home = {n: i for i, g in enumerate(groups) for n in g}
    out = [list(g) for g in groups]
    for i, group in enumerate(groups):
        for node in group:
            for w in written(node):
                if w.op != "call_function" or home.get(w, i) >= i:
                    continue
                order = {n: k for k, n in enumerate(w.graph.nodes)}
                first = min((u for u in w.users if home.get(u) == i), key=order.__getitem__)
                chain = _made_of_constants(w)
                if chain is not None:
                    made: dict[torch.fx.Node, torch.fx.Node] = {}
                    with w.graph.inserting_before(first):
                        for c in chain:
                            made[c] = w.graph.node_copy(c, made.__getitem__)
                    for u in [u for u in w.users if home.get(u) == i]:
                        u.replace_input_with(w, made[w])
                    out[i] = list(made.values()) + out[i]
                    home.update((n, i) for n in made.values())
                elif all(a.op == "get_attr" for a in w.all_input_nodes) and all(home.get(u) == i for u in w.users):
                    first.prepend(w)
                    out[home[w]].remove(w)
                    out[i].insert(0, w)
                    home[w] = i
    return [g for g in out if g]


def merged(groups: list[list[torch.fx.Node]]) -> list[list[torch.fx.Node]]:
    """Step 3 of the module docstring."""
    out: list[list[torch.fx.Node]] = []
    for group in groups:
        if out:
            a, b = _heavy(out[-1]), _heavy(group)
            if (a == 0 or b == 0) and a + b <= MAX_HEAVY:
                out[-1] = out[-1] + group
                continue
        out.append(list(group))
    return out


@dataclass
class TensorSpec:
    name: str  # the submodule's placeholder name
    kind: str  # "activation" | "parameter" | "buffer"
    shape: list[int]
    dtype: str
    source: str = ""  # the model's attribute path of a parameter or buffer

    def key(self) -> list[Any]:
        return [self.kind, self.shape, self.dtype]


@dataclass
class Region:
    name: str  # the split's submodule name (submod_N)
    label: str  # the module path it covers, for people
    code: str  # the submodule's forward, as torch.fx writes it
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)
    heavy: list[str] = field(default_factory=list)
    ops: int = 0

    @property
    def digest(self) -> str:
        body = [self.code, [s.key() for s in self.inputs], [s.key() for s in self.outputs]]
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


@dataclass
class Partition:
    split: torch.fx.GraphModule  # the parent graph calling submod_0 .. submod_n
    regions: list[Region]
    seen: dict[str, tuple[list[Any], Any]] = field(default_factory=dict)  # region -> (real args, output)


def canonical(sub: torch.fx.GraphModule) -> None:
    """Name a region's values by position (inputs a0.., the rest v0..), so two regions that do
    the same work (two layers of a stack) have the same code and one digest."""
    inputs = values = 0
    for node in sub.graph.nodes:
        if node.op == "placeholder":
            node.name = node.target = f"a{inputs}"
            inputs += 1
        elif node.op != "output":
            node.name = f"v{values}"
            values += 1
    sub.recompile()


class _Recorder(torch.fx.Interpreter):
    """Runs the split graph on real inputs and keeps what each region was called with."""

    def __init__(self, module: torch.fx.GraphModule) -> None:
        super().__init__(module)
        self.seen: dict[str, tuple[list[Any], Any]] = {}

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        out = super().call_module(target, args, kwargs)
        self.seen[str(target)] = (list(args), out)
        return out


def _spec(name: str, value: Any, kind: str, source: str = "") -> TensorSpec:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} is a {type(value).__name__}, not a tensor: regions pass tensors only")
    return TensorSpec(name, kind, [int(d) for d in value.shape], str(value.dtype).removeprefix("torch."), source)


def partition(gm: torch.fx.GraphModule, root: torch.nn.Module, inputs: list[Any]) -> Partition:
    ops = [n for n in gm.graph.nodes if n.op == "call_function"]
    groups = made_where_written(sourceless_folded(groups_of(ops)))
    index = {n: i for i, g in enumerate(groups) for n in g}
    split = split_module(gm, root, lambda n: index.get(n, 0), keep_original_order=True)
    for node in split.graph.nodes:
        if node.op == "call_module":
            canonical(getattr(split, str(node.target)))
    params = dict(root.named_parameters())
    recorder = _Recorder(split)
    with torch.no_grad():
        recorder.run(*inputs)
    regions = []
    for node in split.graph.nodes:
        if node.op != "call_module":
            continue
        sub = getattr(split, str(node.target))
        args, out = recorder.seen[str(node.target)]
        places = [p for p in sub.graph.nodes if p.op == "placeholder"]
        specs = []
        for place, arg, value in zip(places, node.args, args, strict=True):
            if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
                path = str(arg.target)
                specs.append(_spec(place.name, value, "parameter" if path in params else "buffer", path))
            else:
                specs.append(_spec(place.name, value, "activation"))
        results = out if isinstance(out, tuple | list) else [out]
        outs = [_spec(f"out{i}", r, "activation") for i, r in enumerate(results)]
        members = [n for n in sub.graph.nodes if n.op == "call_function"]
        regions.append(Region(str(node.target), _label([_stack(n) for n in members]),
                              sub.code, specs, outs, [str(n.target) for n in members if is_heavy(n)], len(members)))
    return Partition(split, regions, recorder.seen)
