"""FLOP and minimum-byte counts of a problem's reference forward, and the ci shrink.

FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` for what it knows (matmuls, convs,
attention: 2 FLOPs per multiply-add), plus an estimate for the ops it ignores:
1 FLOP per output element for pointwise ops (``torch.Tag.pointwise``) and 1 FLOP per
element of the largest operand for other computing ops (reductions, softmax, norms,
pooling, scans). Views, copies and factories count nothing.

Minimum bytes: every tensor input, parameter and buffer read once plus every output tensor
written once; what any kernel, however fused, must move.

Both are measured on the ``meta`` device, so even full (GPU-scale) sizes cost nothing; a
problem whose forward cannot run on meta is measured on the CPU instead.

Rewritten work: the FLOPs are those a kernel must really do, and an algebraic identity can
remove most of the reference's (a sum over the outputs of a linear layer is a GEMV with the
summed weight: ``kforge.agents.expert.ir.rewrites``, rule ``sum_through_linear``). A roofline
floor on the reference's GEMM FLOPs would flag such a correct candidate as faster than
possible, so when the reference runs both a matmul and a sum or mean, the same rewrite rules
are applied to the problem's own graph (captured at its effective sizes) and the counted FLOPs
are scaled by the rules' work ratio (after / before, from :func:`~kforge.agents.expert.
rewrites.work`). It depends on the problem alone, never on a candidate's claims; the rules hold
for every input, so no honest kernel can need more work than that. The minimum bytes are
unchanged (the rewritten program still reads every input and parameter once).
"""

from __future__ import annotations

import itertools
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

if TYPE_CHECKING:
    from kforge.problems import LoadedProblem

__all__ = ["count_costs", "count_flops", "flops_and_bytes", "generic_shrink", "rewritten_work", "tensor_bytes"]

CI_MAX_INPUT_ELEMENTS = 2**20
CI_MAX_PARAM_ELEMENTS = 2**22
CI_MAX_FLOPS = 2.0**30
MIN_SHRINKABLE = 16  # constants below this (kernel sizes, strides, dims) are never halved

_FREE = {
    "clone", "copy_", "_to_copy", "detach", "alias", "lift_fresh", "lift_fresh_copy",
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like",
    "full", "full_like", "fill_", "zero_", "new_empty", "new_zeros", "new_ones", "new_full",
    "randn", "rand", "randint", "normal_", "uniform_", "scalar_tensor", "arange",
    "_local_scalar_dense", "contiguous", "cat", "stack", "index_select", "gather",
    "constant_pad_nd", "repeat", "where_self_out",
}  # fmt: skip


class _PointwiseCounter(TorchDispatchMode):
    """Counts the ops ``FlopCounterMode`` ignores (pushed inside it, so it sees ops first)."""

    def __init__(self, known: set[Any]):
        super().__init__()
        self.known = known
        self.flops = 0.0
        self.seen: set[str] = set()  # every op name run (the rewrite gate reads it)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        out = func(*args, **(kwargs or {}))
        packet = func.overloadpacket
        name = packet.__name__
        self.seen.add(name)
        if packet in self.known or func.is_view or name in _FREE:
            return out
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if torch.Tag.pointwise in func.tags:
            self.flops += sum(t.numel() for t in outs)
        else:
            flat = tree_flatten((args, kwargs or {}))[0]
            operands = [t.numel() for t in flat if isinstance(t, torch.Tensor)]
            self.flops += max(operands + [t.numel() for t in outs] + [0])
        return out


def tensor_bytes(value: Any) -> int:
    """Bytes of every tensor in a (nested) value."""
    flat = tree_flatten(value)[0]
    return sum(t.numel() * t.element_size() for t in flat if isinstance(t, torch.Tensor))


def count_costs(model: torch.nn.Module, inputs: list[Any]) -> tuple[float, float, Any]:
    """Run ``model(*inputs)`` once under the counters: (flops, min_bytes, output)."""
    return _count(model, inputs)[:3]  # type: ignore[return-value]


def _count(model: torch.nn.Module, inputs: list[Any]) -> tuple[float, float, Any, set[str]]:
    counter = FlopCounterMode(display=False)
    pointwise = _PointwiseCounter(set(counter.flop_registry))
    with torch.no_grad(), counter, pointwise:
        output = model(*inputs)
    state = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    state_bytes = sum(t.numel() * t.element_size() for t in state.values())
    min_bytes = tensor_bytes(inputs) + state_bytes + tensor_bytes(output)
    return float(counter.get_total_flops()) + pointwise.flops, float(min_bytes), output, pointwise.seen


MATMULS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "mv", "addmv", "dot"}
SUMS = {"sum", "mean"}


def rewritten_work(module: types.ModuleType) -> float:
    """The share of the reference's work left after the expert's algebraic rewrites
    (``after / before`` of :func:`kforge.agents.expert.ir.rewrites.work` on the problem's own
    graph at its effective sizes); 1.0 when no rule removes work or the graph cannot be built."""
    try:
        from kforge.agents.expert.capture.trace import capture_namespace
        from kforge.agents.expert.ir.build import build_graph
        from kforge.agents.expert.ir.rewrites import apply_rewrites, work

        graph = build_graph(capture_namespace(vars(module), symbolic_init=False), rewrite=False)
        before = work(graph)
        after = work(apply_rewrites(graph))
    except Exception:  # noqa: BLE001 - outside the IR (a convolution...): nothing rewritten
        return 1.0
    return after / before if 0 < after < before else 1.0


def count_flops(model: torch.nn.Module, inputs: list[Any]) -> float:
    return count_costs(model, inputs)[0]


def _build(module: types.ModuleType, device: str) -> tuple[torch.nn.Module, list[Any]]:
    with torch.device(device):
        model = module.Model(*module.get_init_inputs())
        inputs = list(module.get_inputs())
    return model, inputs


def flop_fraction(module: types.ModuleType) -> float:
    """The problem's optional ``FLOP_FRACTION``: the share of the counted FLOPs a kernel must
    really do. The counter sees the reference's math (causal attention: full QK^T and PV, then
    a mask), not the work a kernel can skip; a roofline on the full count would flag the very
    kernel the problem asks for."""
    value = getattr(module, "FLOP_FRACTION", 1.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ValueError(f"FLOP_FRACTION must be a number in (0, 1], not {value!r}")
    return float(value)


def flops_and_bytes(problem: LoadedProblem) -> tuple[float, float]:
    """(FLOPs, minimum bytes) of one reference forward at the problem's effective sizes."""
    try:
        flops, nbytes, _, seen = _count(*_build(problem.module, "meta"))
    except Exception:  # noqa: BLE001 - some forwards cannot run on meta: count on the CPU
        torch.manual_seed(0)
        flops, nbytes, _, seen = _count(*_build(problem.module, "cpu"))
    if seen & MATMULS and seen & SUMS:  # the one shape of graph a rule takes work out of
        flops *= rewritten_work(problem.module)
    return flops * flop_fraction(problem.module), nbytes


# --------------------------------------------------------------------------- ci shrink


@dataclass(frozen=True)
class _Probe:
    input_elements: int
    param_elements: int
    flops: float

    def eases(self, before: _Probe) -> bool:
        """Smaller than ``before`` in a measure over its budget."""
        return ((before.input_elements > CI_MAX_INPUT_ELEMENTS and self.input_elements < before.input_elements)
                or (before.param_elements > CI_MAX_PARAM_ELEMENTS and self.param_elements < before.param_elements)
                or (before.flops > CI_MAX_FLOPS and self.flops < before.flops))

    def within_budget(self) -> bool:
        return (
            self.input_elements <= CI_MAX_INPUT_ELEMENTS
            and self.param_elements <= CI_MAX_PARAM_ELEMENTS
            and self.flops <= CI_MAX_FLOPS
        )


def _probe(module: types.ModuleType, values: dict[str, int], forward: bool) -> _Probe | None:
    """Build the model and inputs on ``meta`` with ``values``; None when that fails."""
    from kforge.problem_sizes import get_size, set_size

    saved = {key: get_size(module, key) for key in values}
    try:
        for key, value in values.items():
            set_size(module, key, value)
        model, inputs = _build(module, "meta")
        flops = count_flops(model, inputs) if forward else 0.0
        n_in = sum(t.numel() for t in inputs if isinstance(t, torch.Tensor))
        n_par = sum(t.numel() for t in itertools.chain(model.parameters(), model.buffers()))
        return _Probe(n_in, n_par, flops)
    except Exception:  # noqa: BLE001 - an invalid size combination
        return None
    finally:
        for key, value in saved.items():
            set_size(module, key, value)


def generic_shrink(module: types.ModuleType, sizes: dict[str, int]) -> dict[str, int]:
    """Deterministic ci sizes for a file without ``PRESETS["ci"]``.

    Repeatedly halve the largest of ``sizes`` (ties: alphabetical name) that is at least
    ``MIN_SHRINKABLE``, until the inputs hold at most ``CI_MAX_INPUT_ELEMENTS`` elements,
    the parameters and buffers at most ``CI_MAX_PARAM_ELEMENTS`` and the forward at most
    ``CI_MAX_FLOPS``. A halving that makes the model, its inputs or (when the original
    forward runs on meta) the forward fail is undone and that constant is frozen. Returns
    only the changed constants; {} when even the original sizes cannot be built on meta.
    """
    forward = _probe(module, sizes, forward=True) is not None
    current = dict(sizes)
    probe = _probe(module, current, forward=forward)
    if probe is None:
        return {}
    frozen: set[str] = set()
    while not probe.within_budget():
        candidates = [
            (value, key)
            for key, value in current.items()
            if key not in frozen and value >= MIN_SHRINKABLE
        ]
        if not candidates:
            break
        value, key = min(candidates, key=lambda vk: (-vk[0], vk[1]))
        trial = {**current, key: value // 2}
        result = _probe(module, trial, forward=forward)
        if result is None:
            # constants that must stay equal (KernelBench's HingeLoss broadcasts a [batch_size]
            # target over input_shape[0] == batch_size columns): halve them together
            twins = [k for k, v in current.items() if v == value and k not in frozen]
            if len(twins) > 1:
                trial = {**current, **{k: value // 2 for k in twins}}
                result = _probe(module, trial, forward=forward)
            if result is None:
                frozen.add(key)
                continue
        if not result.eases(probe):
            # a halving that shrinks nothing over the budget (a net's spatial size when only its
            # parameters are over: they are the architecture's) only makes the ci problem a
            # degenerate one (ResNet18 at 14 x 14: BatchNorm over two values per channel)
            frozen.add(key)
            continue
        current, probe = trial, result
    return {key: value for key, value in current.items() if value != sizes[key]}
