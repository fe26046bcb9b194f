"""A model file's forward as one graph: torch.export of ``Model(*get_init_inputs())``.

The export keeps every node's module stack (``nn_module_stack``), which the partition reads,
and the fake tensor of every value (``meta["val"]``: shapes and dtypes of the region inputs).
The model is built from the verifier's seed (``verify.MODEL_SEED``), as the end-to-end
verification builds it, so the statistics a region problem draws its inputs from are the real
model's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


class ModelCaptureError(RuntimeError):
    """The model file could not be loaded or exported (the reason is the message)."""


@dataclass
class ModelGraph:
    path: Path
    preset: str
    sizes: dict[str, int] | None
    module: Any  # the loaded model file (kforge.problems.LoadedProblem.module)
    model: torch.nn.Module
    inputs: list[Any]
    gm: torch.fx.GraphModule  # the exported forward, parameters as attributes (unlifted)
    tuple_output: bool  # the model returns a tuple (else the one tensor the export wraps)


def capture_model(path: Path, *, preset: str = "ci", sizes: dict[str, int] | None = None) -> ModelGraph:
    from kforge.problems import load_problem
    from kforge.verifier.inputs import Case, make_inputs
    from kforge.verifier.verify import MODEL_SEED

    try:
        problem = load_problem(Path(path), preset=preset, sizes=sizes)
        module = problem.module
        torch.manual_seed(MODEL_SEED)
        model = module.Model(*module.get_init_inputs())
        inputs = make_inputs(module, Case(0, MODEL_SEED, "native", None), "cpu")
    except Exception as exc:  # noqa: BLE001 - the model file's own code
        raise ModelCaptureError(f"{type(exc).__name__}: {exc}") from exc
    with torch.no_grad():
        try:
            out = model(*inputs)
        except Exception as exc:  # noqa: BLE001
            raise ModelCaptureError(f"the model's forward failed: {type(exc).__name__}: {exc}") from exc
        try:
            exported = torch.export.export(model, tuple(inputs), strict=False)
        except Exception as exc:  # noqa: BLE001 - export's refusals are many and verbose
            raise ModelCaptureError(f"torch.export failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}") from exc
    return ModelGraph(Path(path), preset, sizes, module, model, inputs, _without_guards(exported.module()),
                      isinstance(out, tuple | list))


CHECKS = ("_assert_tensor_metadata", "_assert_scalar", "_assert_async", "sym_constrain_range")


def _without_guards(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The exported module less its checks: the input-guard call (``_guards_fn``: the shapes it
    was traced at) and the metadata asserts the export writes beside ops (``_assert_*``), which
    are no operations of the model's and belong to no region."""
    for node in reversed(list(gm.graph.nodes)):
        check = (node.op == "call_module" and str(node.target) == "_guards_fn") or (
            node.op == "call_function" and str(getattr(node.target, "__name__", "")).startswith(CHECKS))
        if check and not node.users:
            gm.graph.erase_node(node)
    gm.recompile()
    return gm
