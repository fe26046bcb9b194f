"""Holding parameters in a reference layer is allowed; calling that layer is not."""

from __future__ import annotations

from pathlib import Path

from kforge.verifier.checks import static_check
from kforge.verifier.reasons import Reason

PROBLEM = (Path(__file__).resolve().parents[2] / "problems" / "starter" / "gemm_bias_relu.py").read_text()
HOLDS = '''import torch, torch.nn as nn
class ModelNew(nn.Module):
    def __init__(self, a, b):
        super().__init__()
        self.linear = nn.Linear(a, b)
    def forward(self, x):
        return my_gemm_relu(x, self.linear.weight, self.linear.bias)
'''


def test_layer_built_in_init_only_to_hold_parameters_passes() -> None:
    assert static_check(HOLDS, PROBLEM, platform="cpu") == []


def test_calling_the_layer_in_forward_is_rejected() -> None:
    calls = HOLDS.replace("my_gemm_relu(x, self.linear.weight, self.linear.bias)", "torch.relu(self.linear(x))")
    reasons = {f.reason for f in static_check(calls, PROBLEM, platform="cpu")}
    assert Reason.CALLS_REFERENCE_OP in reasons


def test_constructing_a_layer_inside_forward_is_rejected() -> None:
    builds = HOLDS.replace("my_gemm_relu(x, self.linear.weight, self.linear.bias)",
                           "nn.Linear(4, 4)(x)")
    reasons = {f.reason for f in static_check(builds, PROBLEM, platform="cpu")}
    assert Reason.CALLS_REFERENCE_OP in reasons


CNN_PROBLEM = '''import torch, torch.nn as nn
def conv_block(c):
    return nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(inplace=True))
class Model(nn.Module):
    def __init__(self, c):
        super(Model, self).__init__()
        self.body = self._make_layer(c)
        nn.init.kaiming_normal_(self.body[0][0].weight)
    def _make_layer(self, c):
        return nn.Sequential(conv_block(c), conv_block(c))
    def forward(self, x):
        return self.body(x)
'''


def test_layers_built_by_helpers_outside_forward_and_nn_init_only_hold_parameters() -> None:
    # KernelBench's CNNs build their layers in helper methods and functions that __init__
    # calls, and fill weights with nn.init.*: a candidate that copies them to hold the same
    # state_dict is not the reference (before, this was "calls every torch op the reference calls")
    candidate = CNN_PROBLEM.replace("class Model(", "class ModelNew(").replace("super(Model, self)", "super()").replace(
        "return self.body(x)", "return my_conv_stack(x, self.state_dict())")
    assert static_check(candidate, CNN_PROBLEM, platform="cpu") == []
    # the reference's helper-built layers still name its compute: a conv in forward is refused
    for forward in ("return nn.Conv2d(4, 4, 3)(x)", "return torch.nn.functional.conv2d(x, self.body[0][0].weight)"):
        calls = candidate.replace("return my_conv_stack(x, self.state_dict())", forward)
        assert Reason.CALLS_REFERENCE_OP in {f.reason for f in static_check(calls, CNN_PROBLEM, platform="cpu")}


def test_problem_folder_under_tmp_is_visible_to_the_sandboxed_reference(tmp_path: Path) -> None:
    """bwrap mounts a private /tmp: the problem's folder must be bound for both workers."""
    import shutil

    from kforge.platforms.cpu import PLATFORM
    from kforge.verifier import verify_candidate

    refs = Path(__file__).resolve().parents[2] / "refs" / "cpu"
    shutil.copy(refs / "problem.py", tmp_path / "problem.py")
    source = (refs / "solution.py").read_text()
    assert PLATFORM.build(source, tmp_path / "build").ok  # built here, not left to an earlier test
    verdict = verify_candidate(source, tmp_path / "problem.py", platform="cpu", policy="strict", trials=1,
                               timeout_s=120, build_dir=tmp_path / "build")
    assert verdict.ok, verdict
