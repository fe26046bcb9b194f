"""Problem suites and the loader: every problem loads and runs; presets, errors, flags."""

from __future__ import annotations

import hashlib
import math
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kforge.problem_cost import CI_MAX_INPUT_ELEMENTS
from kforge.problems import (
    ProblemError,
    degenerate_flags,
    load_problem,
    load_problem_source,
    load_suite,
    problem_meta,
    reference_case,
)

ROOT = Path(__file__).resolve().parents[1]
SUITES = {"starter": 10, "level1": 30, "level2": 50}
CATEGORIES = {
    "elementwise", "reduction", "normalization", "gemm", "gemm_epilogue", "conv",
    "conv_epilogue", "pooling", "scan", "loss", "attention", "softmax",
}  # fmt: skip
ALL = [
    (suite, path) for suite in SUITES for path in sorted((ROOT / "problems" / suite).glob("*.py"))
]


def write(folder: Path, name: str, body: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path


GOOD = """
import torch
import torch.nn as nn

batch_size = 64
dim = 128
PRESETS = {"ci": {"batch_size": 8}}

class Model(nn.Module):
    def forward(self, x):
        return {expr}

def get_inputs():
    return [torch.randn(batch_size, dim)]

def get_init_inputs():
    return []
"""

FOREIGN = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        return torch.relu(self.fc(x)) * self.scale

batch_size = 4096
in_features = 8192
out_features = 2048
kernel_size = 3
scale = 2.0

def get_inputs():
    return [torch.randn(batch_size, in_features)]

def get_init_inputs():
    return [in_features, out_features, scale]
"""


def test_suites_have_enough_problems() -> None:
    for suite, minimum in SUITES.items():
        names = [p.stem for p in (ROOT / "problems" / suite).glob("*.py")]
        assert len(names) >= minimum, suite
    starter = {p.stem for p in (ROOT / "problems" / "starter").glob("*.py")}
    assert len(starter) == 10 and "gemm_gelu_scale" in starter


@pytest.mark.parametrize(("suite", "path"), ALL, ids=[f"{s}/{p.stem}" for s, p in ALL])
def test_problem_loads_and_reference_runs(suite: str, path: Path) -> None:
    problem = load_problem(path, suite=suite, preset="ci")
    assert problem.module.__doc__ and len(problem.module.__doc__) > 40
    assert problem.category in CATEGORIES
    assert problem.sizes(), "a problem needs integer size constants"
    full = load_problem(path, suite=suite, preset="full")
    ci_in = sum(t.numel() for t in problem.get_inputs() if isinstance(t, torch.Tensor))
    with torch.device("meta"):
        full_in = sum(t.numel() for t in full.get_inputs() if isinstance(t, torch.Tensor))
    assert ci_in < full_in, "the ci preset must be smaller than the full sizes"
    model, inputs = reference_case(problem, seed=0)
    with torch.no_grad():
        out = model(*inputs)
    assert isinstance(out, torch.Tensor)
    assert torch.isfinite(out.double()).all()


def test_presets_change_sizes() -> None:
    path = ROOT / "problems" / "starter" / "gemm_bias_relu.py"
    ci = load_problem(path, preset="ci")
    full = load_problem(path, preset="full")
    none = load_problem(path, preset="none")
    assert ci.sizes() == {"batch_size": 256, "in_features": 1024, "out_features": 1024}
    assert full.sizes() == {"batch_size": 1024, "in_features": 8192, "out_features": 8192}
    assert none.sizes() == full.sizes()
    over = load_problem(path, preset="ci", sizes={"batch_size": 3})
    assert over.sizes()["batch_size"] == 3 and over.sizes()["in_features"] == 1024
    assert over.get_inputs()[0].shape == (3, 1024)
    assert ci.get_init_inputs() == [1024, 1024]
    # Separate module objects: sizes never leak between loads, nothing in sys.modules.
    assert ci.module is not over.module and ci.sizes()["batch_size"] == 256
    assert ci.module.__name__ not in sys.modules
    assert ci.module.__name__ != over.module.__name__


def test_foreign_file_loads_unmodified_and_ci_shrinks(tmp_path: Path) -> None:
    path = write(tmp_path, "foreign", FOREIGN)
    full = load_problem(path, preset="full")
    assert full.sizes() == {
        "batch_size": 4096, "in_features": 8192, "out_features": 2048, "kernel_size": 3
    }  # fmt: skip
    ci = load_problem(path, preset="ci")
    sizes = ci.sizes()
    assert sizes["kernel_size"] == 3, "small constants are never shrunk"
    inputs = ci.get_inputs()
    assert sum(t.numel() for t in inputs) <= CI_MAX_INPUT_ELEMENTS
    assert sizes["batch_size"] < 4096 and sizes["in_features"] < 8192
    assert load_problem(path, preset="ci").sizes() == sizes, "shrink is deterministic"
    assert path.read_text() == textwrap.dedent(FOREIGN)
    model, inputs = reference_case(ci)
    with torch.no_grad():
        assert model(*inputs).shape == (sizes["batch_size"], sizes["out_features"])


def test_foreign_shrink_keeps_init_inputs_valid(tmp_path: Path) -> None:
    # Halving `channels` below `groups` * 16 would break GroupNorm; the shrink must notice.
    src = """
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, groups, channels):
            super().__init__()
            self.norm = nn.GroupNorm(groups, channels)
        def forward(self, x):
            return self.norm(x)

    batch_size = 64
    groups = 96
    channels = 96
    size = 256

    def get_inputs():
        return [torch.randn(batch_size, channels, size, size)]

    def get_init_inputs():
        return [groups, channels]
    """
    problem = load_problem(write(tmp_path, "gn", src), preset="ci")
    sizes = problem.sizes()
    assert sizes["channels"] % sizes["groups"] == 0
    assert sum(t.numel() for t in problem.get_inputs()) <= CI_MAX_INPUT_ELEMENTS
    model, inputs = reference_case(problem)
    assert model(*inputs).shape == inputs[0].shape


def test_tuple_sizes_shrink_and_equal_constants_shrink_together(tmp_path: Path) -> None:
    # KernelBench's HingeLoss: a [batch_size] target broadcasts over input_shape[0] columns,
    # so neither constant can be halved alone; at full size the inputs are 4 GB.
    src = """
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self):
            super(Model, self).__init__()
        def forward(self, predictions, targets):
            return torch.mean(torch.clamp(1 - predictions * targets, min=0))

    batch_size = 32768
    input_shape = (32768,)
    dim = 1

    def get_inputs():
        return [torch.rand(batch_size, *input_shape), torch.randint(0, 2, (batch_size,)).float() * 2 - 1]

    def get_init_inputs():
        return []
    """
    problem = load_problem(write(tmp_path, "hinge", src), preset="ci")
    sizes = problem.sizes()
    assert sizes["input_shape[0]"] == sizes["batch_size"] < 32768 and sizes["dim"] == 1
    assert problem.module.input_shape == (sizes["batch_size"],)
    assert sum(t.numel() for t in problem.get_inputs()) <= CI_MAX_INPUT_ELEMENTS
    model, inputs = reference_case(problem)
    assert model(*inputs).shape == ()
    # a tuple element is a size like any other: presets and explicit sizes may set it
    again = load_problem(write(tmp_path, "hinge2", src), preset="none", sizes={"batch_size": 8, "input_shape[0]": 8})
    assert again.module.input_shape == (8,) and again.get_inputs()[0].shape == (8, 8)


BAD_FILES = {
    "import_error": "import torch\ndef broken(:\n",
    "no_model": "import torch\ndef get_inputs():\n    return []\n",
    "model_not_module": "class Model:\n    pass\ndef get_inputs():\n    return []\n"
    "def get_init_inputs():\n    return []\n",
    "no_get_inputs": GOOD.replace("def get_inputs", "def make_inputs"),
    "no_get_init_inputs": GOOD.replace("def get_init_inputs", "def init_inputs"),
    "bad_inputs": GOOD.replace("return [torch.randn(batch_size, dim)]", "return torch.ones(3)"),
    "bad_preset": GOOD.replace('{"batch_size": 8}', '{"no_such_size": 8}'),
}


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_each_error_kind(tmp_path: Path, kind: str) -> None:
    path = write(tmp_path, f"bad_{kind}", BAD_FILES[kind].replace("{expr}", "x"))
    with pytest.raises(ProblemError) as info:
        load_problem(path, suite="bad")
    err = info.value
    assert err.kind == kind and err.name == f"bad_{kind}" and err.path == path
    assert kind in str(err) and f"bad_{kind}" in str(err)


def test_bad_preset_name_and_size() -> None:
    source = textwrap.dedent(GOOD).replace("{expr}", "x * 2")
    with pytest.raises(ProblemError, match="unknown preset") as info:
        load_problem_source(source, "good", preset="huge")
    assert info.value.kind == "bad_preset"
    with pytest.raises(ProblemError, match="unknown size constant"):
        load_problem_source(source, "good", sizes={"depth": 2})
    assert load_problem_source(source, "good", preset="ci").sizes()["batch_size"] == 8


def test_load_suite_reports_errors_without_stopping(tmp_path: Path) -> None:
    write(tmp_path, "a_good", GOOD.replace("{expr}", "x * 2"))
    write(tmp_path, "b_bad", BAD_FILES["import_error"])
    write(tmp_path, "c_good", GOOD.replace("{expr}", "x + 1"))
    write(tmp_path, "_helper", "raise RuntimeError('never loaded')\n")
    problems, errors = load_suite(tmp_path, suite="mix", sizes={"dim": 16, "absent": 1})
    assert [p.name for p in problems] == ["a_good", "c_good"]
    assert [(e.name, e.kind) for e in errors] == [("b_bad", "import_error")]
    assert all(p.suite == "mix" and p.sizes()["dim"] == 16 for p in problems)
    only, _ = load_suite(tmp_path, suite="mix", include=["c_good"])
    assert [p.name for p in only] == ["c_good"]


@pytest.mark.parametrize(
    ("expr", "flag"),
    [
        ("x * 0.0", "zero_output_passes"),
        ("x + 0.0", "identity_output_passes"),
        ("torch.nn.functional.dropout(x, 0.5, training=True)", "nondeterministic"),
        ("torch.zeros_like(x) + 3.0", "constant_output_passes"),
    ],
)
def test_degenerate_flags(tmp_path: Path, expr: str, flag: str) -> None:
    problem = load_problem(write(tmp_path, "degenerate", GOOD.replace("{expr}", expr)))
    assert flag in degenerate_flags(problem)
    assert flag in problem_meta(problem).degenerate


def test_dropout_module_in_training_mode_is_flagged(tmp_path: Path) -> None:
    src = GOOD.replace(
        "class Model(nn.Module):",
        "class Model(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        "        self.drop = nn.Dropout(0.3)\n",
    ).replace("{expr}", "self.drop(x)")
    assert degenerate_flags(load_problem(write(tmp_path, "drop", src))) == ["nondeterministic"]


def test_real_problems_are_not_degenerate() -> None:
    for name in ("softmax_rows", "gemm_bias_relu", "reduce_max_rows"):
        problem = load_problem(ROOT / "problems" / "starter" / f"{name}.py", suite="starter")
        meta = problem_meta(problem)
        assert meta.degenerate == [], name
        assert meta.error is None
        assert meta.source_digest == hashlib.sha256(problem.source.encode()).hexdigest()
        assert meta.suite == "starter" and meta.preset == "ci" and meta.flops > 0
        assert math.isclose(meta.min_bytes, meta.min_bytes) and meta.min_bytes > 0


def test_level2_gemm_tail_problems_flags() -> None:
    """034-053 (KernelBench-style GEMM / BMM + tail problems): none is degenerate, except the
    training-mode dropout one, whose reference is random on purpose and must be flagged."""
    level2 = sorted((ROOT / "problems" / "level2").glob("*.py"))
    paths = [p for p in level2 if 34 <= int(p.name[:3]) <= 53]
    assert len(paths) == 20
    for path in paths:
        meta = problem_meta(load_problem(path, suite="level2", preset="ci"))
        expected = ["nondeterministic"] if path.stem == "044_gemm_dropout_train_gelu" else []
        assert meta.error is None and meta.degenerate == expected, (path.stem, meta)


def test_a_list_of_sizes_is_shrunk_like_a_tuple() -> None:
    """KernelBench's MLPs keep their widths in a list (``hidden_layer_sizes = [32768, 32768]``):
    its elements are size constants too, so the ci preset shrinks them (the whole model was
    8.6 GB of weights at ci sizes before)."""
    source = (
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self, sizes):\n"
        "        super().__init__()\n"
        "        self.layers = nn.Sequential(*[nn.Linear(a, b) for a, b in zip(sizes, sizes[1:])])\n"
        "    def forward(self, x):\n"
        "        return self.layers(x)\n\n"
        "widths = [8192, 32768, 8192]\n\n"
        "def get_inputs():\n    return [torch.randn(16, widths[0])]\n\n"
        "def get_init_inputs():\n    return [widths]\n"
    )
    problem = load_problem_source(source, "wide_mlp", preset="ci")
    sizes = problem.sizes()
    assert {"widths[0]", "widths[1]", "widths[2]"} <= set(sizes) and sizes["widths[1]"] < 32768
    assert type(problem.module.widths) is list and problem.module.widths[1] == sizes["widths[1]"]
