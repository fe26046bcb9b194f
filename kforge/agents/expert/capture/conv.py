"""Convolutions as an implicit GEMM the rest of the compiler already knows, during the trace only.

``F.conv{1,2,3}d`` and ``F.conv_transpose{1,2,3}d`` reach :class:`.sizes.GenericSizes`
and are traced as the same math over ops the IR has (``unfold``, strided ``slice``, ``cat``
with zeros for padding, ``permute`` / ``view``, ``mm`` / ``bmm``, ``add``), so every
convolution arrives as a GEMM whose A operand is an index map over the input (im2col, which the planner materialises
as the GEMM's prologue) and whose epilogue fuses what follows (bias, activations, norms)::

    conv:            out[n, co, o] = sum_{c, k} x_pad[n, g(co) c, o * s + k * d] w[co, c, k]
                     A = the padded input unfolded into its K = C/g * prod(k) windows
    conv_transpose:  one stride-1 conv per output phase r (o = q s + r): it meets only the
                     taps t with (r + p - t d) % s == 0, at input q + (r + p - t d) / s, so
                     each phase is a conv with those taps flipped; the phases are interleaved
                     (stack + flatten per dim). No multiply by an inserted zero.

Window sizes, strides, paddings and dilations are taken as plain integers (``int()`` pins a
size symbol to its value: ``capture`` records it in ``fixed_init`` and ``ModelNew`` refuses
other values); a group count that is a size symbol stays one (``groups=in_channels``, a
depthwise conv: the groups are then the batch of a ``bmm``); batch, channels and spatial
sizes stay symbolic.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch

F = torch.nn.functional


def _tuple(value: Any, nd: int, what: str) -> list[int]:
    vals = list(value) if isinstance(value, list | tuple) else [value] * nd
    if len(vals) == 1:
        vals = vals * nd
    if len(vals) != nd:
        raise ValueError(f"conv {what}: {len(vals)} values for {nd} spatial dims")
    return [int(v) for v in vals]


def _groups(groups: Any) -> Any:
    """A group count stays a size symbol (a depthwise conv's ``groups=in_channels`` is the
    channel count: pinning it would pin the channels); the groups are then a batched GEMM."""
    return groups if isinstance(groups, torch.SymInt) else int(groups)


def _pad_or_crop(x: torch.Tensor, before: list[int], after: list[int]) -> torch.Tensor:
    """Zero-pad (or crop, for a negative amount) the trailing ``len(before)`` dims."""
    nd = len(before)
    for i in range(nd):
        dim = x.dim() - nd + i
        lo, hi = before[i], after[i]
        if lo < 0:
            x = x.narrow(dim, -lo, x.shape[dim] + lo)
            lo = 0
        if hi < 0:
            x = x.narrow(dim, 0, x.shape[dim] + hi)
            hi = 0
        if lo or hi:  # as a cat with zeros: F.pad's C++ shape check would pin every size symbol
            parts = [x.new_zeros(*x.shape[:dim], lo, *x.shape[dim + 1:])] if lo else []
            parts.append(x)
            if hi:
                parts.append(x.new_zeros(*x.shape[:dim], hi, *x.shape[dim + 1:]))
            x = torch.cat(parts, dim=dim)
    return x


def conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: Any = 1,
         padding: Any = 0, dilation: Any = 1, groups: Any = 1) -> torch.Tensor:
    """``F.convNd`` (any N) as im2col + one (batched per group) matrix product."""
    nd = weight.dim() - 2
    unbatched = x.dim() == nd + 1
    if unbatched:
        x = x.unsqueeze(0)
    k = [int(v) for v in weight.shape[2:]]
    s, d, g = _tuple(stride, nd, "stride"), _tuple(dilation, nd, "dilation"), _groups(groups)
    if isinstance(padding, str):
        if padding == "valid":
            before = after = [0] * nd
        elif padding == "same":
            total = [di * (ki - 1) for di, ki in zip(d, k, strict=True)]
            before = [t // 2 for t in total]
            after = [t - b for t, b in zip(total, before, strict=True)]
        else:
            raise ValueError(f"conv padding {padding!r}")
    else:
        before = after = _tuple(padding, nd, "padding")
    xp = _pad_or_crop(x, before, after)
    n, c = xp.shape[0], xp.shape[1]
    out = [(xp.shape[2 + i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(nd)]
    # the windows as index maps (unfold: position i, tap j -> element i * s + j), strided by the
    # dilation: one load per im2col element, not a select among prod(k) shifted copies
    cols = xp
    for i in range(nd):
        cols = cols.unfold(2 + i, d[i] * (k[i] - 1) + 1, s[i])
        if d[i] > 1:
            cols = cols[(slice(None),) * (cols.dim() - 1) + (slice(None, None, d[i]),)]
    # [N, C, *out, *k] -> [N, C, KK, *out]
    cols = cols.permute(0, 1, *range(2 + nd, 2 + 2 * nd), *range(2, 2 + nd))
    kk = math.prod(k)
    co = weight.shape[0]
    length = math.prod(out)  # every size spelled out: a -1 would make the trace guard on sizes
    if g == 1:
        a = cols.reshape(n, c * kk, length).permute(0, 2, 1).reshape(n * length, c * kk)  # [N * L, C * KK]
        y = torch.mm(a, weight.reshape(co, c * kk).t())  # [N * L, CO]
        y = y.reshape(n, length, co).permute(0, 2, 1)
    else:
        cg, cog = c // g, co // g
        a = cols.reshape(n, g, cg * kk, length).permute(1, 0, 3, 2).reshape(g, n * length, cg * kk)
        b = weight.reshape(g, cog, cg * kk).permute(0, 2, 1)  # [G, Cg * KK, COg]
        y = torch.bmm(a, b).reshape(g, n, length, cog).permute(1, 0, 3, 2).reshape(n, co, length)
    y = y.reshape([n, co, *out])
    if bias is not None:
        y = y + bias.reshape([1, co] + [1] * nd)
    return y.squeeze(0) if unbatched else y


def conv_transpose(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride: Any = 1,
                   padding: Any = 0, output_padding: Any = 0, groups: Any = 1, dilation: Any = 1) -> torch.Tensor:
    """``F.conv_transposeNd`` as ``prod(stride)`` stride-1 :func:`conv` s, one per output phase
    (sub-pixel): output ``o = q s + r`` only meets window taps ``t`` with ``(r + p - t d) % s == 0``,
    at input ``q + (r + p - t d) / s``; the phases are interleaved back. No zeros are multiplied."""
    nd = weight.dim() - 2
    unbatched = x.dim() == nd + 1
    if unbatched:
        x = x.unsqueeze(0)
    k = [int(v) for v in weight.shape[2:]]
    s, p = _tuple(stride, nd, "stride"), _tuple(padding, nd, "padding")
    op, d, g = _tuple(output_padding, nd, "output_padding"), _tuple(dilation, nd, "dilation"), _groups(groups)
    cin, cog = weight.shape[0], weight.shape[1]
    co = cog * g
    # the conv layout [CO, Cin/g, *k], not flipped: each phase flips its own taps
    w = weight.reshape([g, cin // g, cog, *k]).transpose(1, 2).reshape([co, cin // g, *k])
    phases = [[_Phase(r, k[i], s[i], p[i], op[i], d[i]) for r in range(s[i])] for i in range(nd)]
    outs: dict[tuple[int, ...], torch.Tensor] = {}
    for rs in itertools.product(*(range(si) for si in s)):
        ph = [phases[i][r] for i, r in enumerate(rs)]
        lengths = [x.shape[2 + i] + ph[i].extra for i in range(nd)]  # Q_r = L_in + a constant
        if any(not q.taps for q in ph):
            outs[rs] = x.new_zeros([x.shape[0], co, *lengths])
            continue
        xp = _pad_or_crop(x, [q.before for q in ph], [q.after for q in ph])
        wp = w
        for i, q in enumerate(ph):
            wp = wp[(slice(None),) * (2 + i) + (slice(q.taps[0], q.taps[-1] + 1, q.tap_step),)]
        wp = wp.flip(list(range(2, 2 + nd)))
        outs[rs] = conv(xp, wp, None, 1, 0, [q.dilation for q in ph], g)
    for axis in reversed(range(nd)):  # interleave the phases of one dim at a time
        dim = 2 + axis
        merged: dict[tuple[int, ...], torch.Tensor] = {}
        for prefix in sorted({key[:axis] for key in outs}):
            parts = []
            for r in range(s[axis]):
                part = outs[prefix + (r,)]
                short = phases[axis][0].extra - phases[axis][r].extra  # Q_0 - Q_r: 0 or 1
                if short:
                    after = [0] * nd
                    after[axis] = short
                    part = _pad_or_crop(part, [0] * nd, after)
                parts.append(part)
            y = torch.stack(parts, dim=dim + 1).flatten(dim, dim + 1) if len(parts) > 1 else parts[0]
            length = (x.shape[dim] - 1) * s[axis] - 2 * p[axis] + d[axis] * (k[axis] - 1) + op[axis] + 1
            merged[prefix] = y.narrow(dim, 0, length) if len(parts) > 1 else y
        outs = merged
    y = outs[()]
    if bias is not None:
        y = y + bias.reshape([1, co] + [1] * nd)
    return y.squeeze(0) if unbatched else y


class _Phase:
    """One output phase ``r`` of one dim of a transposed conv (see :func:`conv_transpose`)."""

    def __init__(self, r: int, k: int, s: int, p: int, op: int, d: int) -> None:
        self.taps = [t for t in range(k) if (r + p - t * d) % s == 0]
        self.tap_step = s // math.gcd(d, s)
        self.dilation = d // math.gcd(d, s)
        # Q_r = ceil((L_out - r) / s) = L_in + extra
        self.extra = -((-(d * (k - 1) + op + 1 - r - 2 * p - s)) // s)
        offsets = [(r + p - t * d) // s for t in self.taps]  # input index - q, per tap
        self.before = -min(offsets) if offsets else 0
        span = self.dilation * (len(self.taps) - 1) if self.taps else 0
        self.after = self.extra - self.before + span


CONV = {F.conv1d: conv, F.conv2d: conv, F.conv3d: conv, torch.conv1d: conv, torch.conv2d: conv, torch.conv3d: conv,
        F.conv_transpose1d: conv_transpose, F.conv_transpose2d: conv_transpose, F.conv_transpose3d: conv_transpose,
        torch.conv_transpose1d: conv_transpose, torch.conv_transpose2d: conv_transpose,
        torch.conv_transpose3d: conv_transpose}
