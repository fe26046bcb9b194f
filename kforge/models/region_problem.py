"""A region as a KernelBench problem file of its own.

    class Model(nn.Module):      the region's parameters and buffers as its own, drawn like the
        __init__                 model's (mean and spread of each), so the pipeline's ModelNew
                                 shares their names and a stitched forward can hand it the
                                 model's real ones
        forward(activations)     the region's code, as torch.fx wrote it (``torch.ops.aten.*``)
    get_inputs()                 the activations drawn like the ones the model really passed it
    get_init_inputs()            []

Nothing of the model's values is written into the file: every size is a literal, every tensor a
random draw with the recorded statistics (integer inputs between the recorded bounds).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from kforge.models.partition import Region, TensorSpec

# aten overloads whose argument order is their functional's: written as the functional, which
# the expert's capture turns into its own math (its convolution decomposition hooks F.conv*)
FUNCTIONAL = {f"torch.ops.aten.{op}.{overload}": f"torch.nn.functional.{op}"
              for op, overload in (("conv1d", "default"), ("conv2d", "default"), ("conv3d", "default"),
                                   ("conv_transpose1d", "input"), ("conv_transpose2d", "input"),
                                   ("conv_transpose3d", "input"), ("linear", "default"))}


def _stats(t: torch.Tensor) -> dict[str, float]:
    x = t.detach().to(torch.float64)
    if not x.numel():
        return {"mean": 0.0, "std": 0.0, "lo": 0.0, "hi": 0.0}
    return {"mean": float(x.mean()), "std": float(x.std()) if x.numel() > 1 else 0.0,
            "lo": float(x.min()), "hi": float(x.max())}


def _draw(spec: TensorSpec, value: torch.Tensor) -> str:
    """A torch expression drawing a tensor like ``value`` (the spec's shape and dtype)."""
    shape = tuple(spec.shape)
    dtype = f"torch.{spec.dtype}"
    s = _stats(value)
    if value.dtype == torch.bool:
        return f"(torch.rand({shape}) < {s['mean']:.6g})"
    if not value.is_floating_point():
        if value.numel() == 1 or s["lo"] == s["hi"]:
            return f"torch.full({shape}, {int(s['lo'])}, dtype={dtype})"
        return f"torch.randint({int(s['lo'])}, {int(s['hi']) + 1}, {shape}, dtype={dtype})"
    if s["std"] == 0.0:
        return f"torch.full({shape}, {s['mean']:.8g}, dtype={dtype})"
    return f"(torch.randn({shape}) * {s['std']:.6g} + {s['mean']:.6g}).to({dtype})"


def attribute(spec: TensorSpec, i: int) -> str:
    """The region problem's attribute name of its ``i``-th input (a parameter or buffer)."""
    return f"{'w' if spec.kind == 'parameter' else 'b'}{i}"


def custom_op_modules(code: str) -> dict[str, str]:
    """The module that registered each custom op namespace ``code`` calls (``torch.ops.
    transformers.grouped_mm_fallback``: transformers' MoE fallback), which a fresh process must
    import before the op exists. A namespace torch itself defines needs none."""
    from torch._library.custom_ops import OPDEFS

    out = {}
    for ns, op in re.findall(r"torch\.ops\.(\w+)\.(\w+)", code):
        opdef = OPDEFS.get(f"{ns}::{op}")
        if opdef is not None and ns not in out:
            out[ns] = opdef._init_fn.__module__
    return out


def region_source(region: Region, args: list[Any], model_file: str) -> str:
    """The problem file of ``region``; ``args``: the real values it was called with, in its
    placeholders' order (``Partition.seen``)."""
    body = re.sub(r"^def forward\(self", "def _region(self", region.code.strip(), count=1, flags=re.M)
    for aten, functional in FUNCTIONAL.items():
        body = body.replace(aten + "(", functional + "(")
    device = r"device\(type='[a-z]+'(?:, index=\d+)?\)"  # the device the capture ran on, a literal
    if region.inputs and re.search(device, body):  # the region's inputs' instead (on a GPU, theirs)
        body = re.sub(device, "_device", body)
        body = re.sub(r"^(def _region\(.*\):\n)", r"\1    _device = a0.device\n", body, count=1, flags=re.M)
    lines = [
        f'"""Region {region.name} of {model_file}: {region.label or "its own operations"} '
        f'({region.ops} ops{", " + ", ".join(region.heavy[:4]) if region.heavy else ""}).',
        "",
        "Written by kforge.models.region_problem: the region's code as torch.fx wrote it, its parameters",
        'and inputs drawn like the model\'s own."""',
        "",
        "from math import inf, nan  # noqa: F401 - names torch.fx's code may use",
        "",
        "import torch",
        "import torch.nn as nn",
        *[f"import {m}  # registers torch.ops.{ns}" for ns, m in custom_op_modules(body).items()],
        "",
        "",
        "class Model(nn.Module):",
        "    def __init__(self):",
        "        super().__init__()",
    ]
    call = []
    for i, (spec, value) in enumerate(zip(region.inputs, args, strict=True)):
        if spec.kind == "activation":
            call.append(spec.name)
            continue
        attr = attribute(spec, i)
        if spec.kind == "parameter":
            lines.append(f"        self.{attr} = nn.Parameter({_draw(spec, value)})  # {spec.source}")
        else:
            lines.append(f"        self.register_buffer({attr!r}, {_draw(spec, value)})  # {spec.source}")
        call.append(f"self.{attr}")
    acts = [s.name for s in region.inputs if s.kind == "activation"]
    lines += ["", f"    def forward(self{''.join(', ' + a for a in acts)}):",
              f"        return _region(self, {', '.join(call)})", "", "", body, "", "",
              "def get_inputs():"]
    draws = [_draw(s, v) for s, v in zip(region.inputs, args, strict=True) if s.kind == "activation"]
    lines += ["    return [" + ", ".join(draws) + "]", "", "", "def get_init_inputs():", "    return []", ""]
    return "\n".join(lines)
