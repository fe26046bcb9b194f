"""One ModelNew for a whole model file: each region's kernel where one shipped, the region's own
PyTorch operations where none did.

The stitched candidate is one module (the verifier's unit), written by :func:`stitched_source`::

    MODEL_FILE, PRESET, SIZES   the model file and the sizes its regions were cut at
    DIGESTS                     every region's digest: the partition the kernels were made for
    <each shipped region's candidate module, its top-level names prefixed (_r3_ModelNew, ...),
     its CPP_SOURCE as CPP_SOURCE_r3: one library per region, built like any other>
    KERNELS                     region -> (its ModelNew, its attributes -> the model's parameters)
    class ModelNew              StitchedModel(...): builds the model file's Model (first, from the
                                seed the verifier sets, so its parameters are the reference's),
                                cuts it as the kernels were made for (the digests must match), and
                                calls each region's kernel with the model's own parameters

A region kernel reads the real weights every call: they are the model's parameters, lent to it.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import torch

from kforge.models.partition import Partition, Region


class StitchError(RuntimeError):
    pass


def prefixed(source: str, prefix: str) -> str:
    """``source`` with every name it binds at module level (not imports) prefixed, and its
    ``CPP_SOURCE`` constants suffixed (``CPP_SOURCE_<prefix>``), so several candidates live in one
    module."""
    tree = ast.parse(source)
    bound: dict[str, str] = {}
    for node in tree.body:
        names: list[str] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        for name in names:
            bound[name] = f"CPP_SOURCE_{prefix}" if name == "CPP_SOURCE" else f"_{prefix}_{name}"

    class Rename(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.Name:
            if node.id in bound:
                node.id = bound[node.id]
            return node

        def _def(self, node: Any) -> Any:
            if node.name in bound and node in tree.body:
                node.name = bound[node.name]
            self.generic_visit(node)
            return node

        visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _def  # noqa: N815

    return ast.unparse(Rename().visit(tree))


def _attributes(region: Region) -> dict[str, str]:
    """The region problem's attribute of each parameter and buffer (region_problem.py) -> the
    model's attribute path."""
    from kforge.models.region_problem import attribute

    return {attribute(spec, i): spec.source for i, spec in enumerate(region.inputs) if spec.kind != "activation"}


def stitched_source(model_file: Path, preset: str, sizes: dict[str, int] | None, partition: Partition,
                    kernels: dict[str, str]) -> str:
    """The stitched candidate: ``kernels`` maps a region's name to its shipped candidate source."""
    lines = [f'"""Stitched forward of {Path(model_file).name}: {len(kernels)} of {len(partition.regions)} regions '
             'by their own kernels (kforge.models.stitch)."""', "",
             "import torch", "import torch.nn as nn", "", "from kforge.models.stitch import StitchedModel", "",
             f"MODEL_FILE = {str(Path(model_file).resolve())!r}", f"PRESET = {preset!r}", f"SIZES = {sizes!r}",
             f"DIGESTS = {({r.name: r.digest for r in partition.regions})!r}", ""]
    table = []
    for region in partition.regions:
        if region.name not in kernels:
            continue
        tag = region.name.replace("submod_", "r")
        lines += [f"# region {region.name} ({region.label}): its shipped kernel", prefixed(kernels[region.name], tag), ""]
        table.append(f"    {region.name!r}: (_{tag}_ModelNew, {_attributes(region)!r}),")
    lines += ["KERNELS = {", *table, "}", "", "",
              "class ModelNew(nn.Module):",
              "    def __init__(self, *init):",
              "        super().__init__()",
              "        self.stitched = StitchedModel(MODEL_FILE, PRESET, SIZES, init, DIGESTS, KERNELS)",
              "", "    def forward(self, *inputs):", "        return self.stitched(*inputs)", ""]
    return "\n".join(lines)


class _Lent(torch.nn.Module):
    """A region's kernel in the split graph's place of the region: the split hands every region
    its activations, parameters and buffers; the kernel takes the activations (it holds the
    model's parameters and buffers as its own)."""

    def __init__(self, kernel: torch.nn.Module, activations: list[int]) -> None:
        super().__init__()
        self.kernel = kernel
        self.activations = activations

    def forward(self, *args: Any) -> Any:
        return self.kernel(*(args[i] for i in self.activations))


def _lend(kernel: torch.nn.Module, attributes: dict[str, str], model: torch.nn.Module) -> None:
    for attr, path in attributes.items():
        owner_path, _, leaf = path.rpartition(".")
        owner = model.get_submodule(owner_path) if owner_path else model
        if leaf in owner._parameters:
            kernel._parameters.pop(attr, None)
            kernel.register_parameter(attr, owner._parameters[leaf])
        elif leaf in owner._buffers:
            kernel._buffers.pop(attr, None)
            kernel.register_buffer(attr, owner._buffers[leaf])
        else:  # KernelBench's VanillaRNN keeps its hidden state so, and reassigns it every call
            raise StitchError(f"the model's {path} is a plain tensor attribute, not a parameter or buffer: "
                              "state its forward may reassign, which a region's kernel cannot be lent")


class StitchedModel(torch.nn.Module):
    """The runtime of a stitched candidate (module docstring)."""

    def __init__(self, model_file: str, preset: str, sizes: dict[str, int] | None, init: tuple[Any, ...],
                 digests: dict[str, str], kernels: dict[str, tuple[type, dict[str, str]]]) -> None:
        super().__init__()
        from kforge.models.partition import partition
        from kforge.problems import load_problem

        module = load_problem(Path(model_file), preset=preset, sizes=sizes).module
        self.model = module.Model(*init)  # first: the verifier's seed makes its parameters the reference's
        inputs = list(module.get_inputs())
        with torch.no_grad():
            out = self.model(*inputs)
            exported = torch.export.export(self.model, tuple(inputs), strict=False)
        from kforge.models.graph import _without_guards

        cut = partition(_without_guards(exported.module()), self.model, inputs)
        found = {r.name: r.digest for r in cut.regions}
        if found != digests:
            raise StitchError("the model's partition is not the one its region kernels were made for")
        self.tuple_output = isinstance(out, tuple | list)
        self.split = cut.split
        for region in cut.regions:
            if region.name in kernels:
                cls, attributes = kernels[region.name]
                kernel = cls()
                _lend(kernel, attributes, self.model)
                acts = [i for i, s in enumerate(region.inputs) if s.kind == "activation"]
                setattr(self.split, region.name, _Lent(kernel, acts))

    def forward(self, *inputs: Any) -> Any:
        out = self.split(*inputs)
        if not self.tuple_output and isinstance(out, tuple | list) and len(out) == 1:
            return out[0]
        return out
