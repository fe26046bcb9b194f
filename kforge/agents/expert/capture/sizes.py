"""What the trace sees in place of the ops whose ATen signature would pin a size symbol to its
value (during :func:`~.trace.capture_problem`'s trace only): ``F.group_norm`` with a symbolic
group count (statistics over a ``[N, G, -1]`` view), a 1-d max pool (the 2-d pool over an
unsqueezed row, whose meta keeps the pooled length a floor-division of the input length),
adaptive pools to one element (a mean or max per channel), ``torch.tensor`` of a number on the
meta device, and convolutions (an implicit GEMM: :mod:`.conv`). The results are the same math.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from kforge.agents.expert.capture.conv import CONV


def _one(value: Any) -> Any:
    return value[0] if isinstance(value, list | tuple) else value


class GenericSizes(TorchFunctionMode):
    """During the trace only: the ops whose ATen signature would pin a size symbol to its
    value get the same math over symbolic sizes (the results are the decompositions' own)."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.group_norm and isinstance(_arg0(args, kwargs, 1, "num_groups"), torch.SymInt):
            return _group_norm(*args, **kwargs)
        if func in MAX_POOL1D:
            return _max_pool1d(*args, **kwargs, indices=MAX_POOL1D[func])
        if func is torch.tensor and isinstance(args[0] if args else None, float | int) \
                and str(kwargs.get("device", "")) == "meta":  # a number's value must survive the trace
            return func(args[0], **{k: v for k, v in kwargs.items() if k != "device"})
        if func in CONV:  # an implicit GEMM over ops the IR has (conv.py)
            return CONV[func](*args, **kwargs)
        if func in GLOBAL_POOL and _global(args, kwargs):  # to one element per channel: a plain reduction
            dims = list(range(2, args[0].dim())) if args[0].dim() > GLOBAL_POOL[func][1] else \
                list(range(1, args[0].dim()))  # unbatched input
            return args[0].mean(dims, keepdim=True) if GLOBAL_POOL[func][0] == "avg" else \
                args[0].amax(dims, keepdim=True)
        return func(*args, **kwargs)


def _global(args: Any, kwargs: dict[str, Any]) -> bool:
    """An adaptive pool to output size 1 in every spatial dim, without indices."""
    size = _arg0(args, kwargs, 1, "output_size")
    sizes = list(size) if isinstance(size, list | tuple) else [size]
    return all(v == 1 for v in sizes) and not _arg0(args, kwargs, 2, "return_indices")


def _arg0(args: Any, kwargs: dict[str, Any], i: int, name: str) -> Any:
    return args[i] if len(args) > i else kwargs.get(name)


def _group_norm(x: torch.Tensor, num_groups: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> torch.Tensor:
    """``F.group_norm`` with the group count a symbol: statistics over a ``[N, G, -1]`` view."""
    n, c = x.shape[0], x.shape[1]
    grouped = x.reshape(n, num_groups, -1)
    var, mean = torch.var_mean(grouped, dim=-1, correction=0, keepdim=True)
    y = ((grouped - mean) * torch.rsqrt(var + eps)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.dim() - 2)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return y


def _max_pool1d(x: torch.Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                ceil_mode: bool = False, return_indices: bool = False, indices: bool | None = None) -> Any:
    """A 1-d max pool as the 2-d pool of the row unsqueezed to height 1 (the 1-d op's C++ shape
    arithmetic would fix the input length; the 2-d meta keeps it a symbol)."""
    k = _one(kernel_size)
    s = _one(stride) if stride not in (None, [], ()) else k
    out, idx = torch.ops.aten.max_pool2d_with_indices(x.unsqueeze(-2), [1, k], [1, s], [0, _one(padding)],
                                                      [1, _one(dilation)], ceil_mode)
    want = return_indices if indices is None else indices
    return (out.squeeze(-2), idx.squeeze(-2)) if want else out.squeeze(-2)


F = torch.nn.functional
# adaptive pools -> (kind, rank of a batched input); output size 1 is a mean / max per channel
GLOBAL_POOL = {F.adaptive_avg_pool1d: ("avg", 2), F.adaptive_avg_pool2d: ("avg", 3), F.adaptive_avg_pool3d: ("avg", 4),
               F.adaptive_max_pool1d: ("max", 2), F.adaptive_max_pool2d: ("max", 3), F.adaptive_max_pool3d: ("max", 4),
               torch.adaptive_avg_pool1d: ("avg", 2)}
# the functions a 1-d max pool reaches __torch_function__ through -> whether they return indices
# (None: as their ``return_indices`` argument says)
MAX_POOL1D = {F.max_pool1d: None, F._max_pool1d: False, F.max_pool1d_with_indices: True, torch.max_pool1d: False,
              torch.max_pool1d_with_indices: True}
