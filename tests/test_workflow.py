from __future__ import annotations

from pathlib import Path

import pytest

from kforge.config import ConfigError
from kforge.workflow import WorkflowPlan

REPO = Path(__file__).resolve().parents[1]


def data(tmp_path: Path, **run: list[str]) -> dict:
    return {
        "store": str(tmp_path / "artifacts"),
        "agents": {"expert": {"kind": "expert"}},
        "suites": {"starter": {"path": str(REPO / "problems" / "starter"), "include": ["softmax_rows", "gemm_bias_relu"]}},
        "run": {"agents": ["expert"], "platforms": ["cpu", "triton"], "suites": ["starter"], **run},
        "rounds": {"functional": 1, "optimization": 1},
    }


def test_grid_rounds_and_targets(tmp_path: Path) -> None:
    plan = WorkflowPlan.from_snakemake_config(data(tmp_path))
    assert plan.grid == [
        ("expert", "cpu", "starter", "gemm_bias_relu"), ("expert", "cpu", "starter", "softmax_rows"),
        ("expert", "triton", "starter", "gemm_bias_relu"), ("expert", "triton", "starter", "softmax_rows"),
    ]
    assert plan.last_round == 2
    assert len(plan.selections()) == 4
    assert len(plan.records()) == 4 * 3 * 5
    assert Path(plan.resolved).is_file()  # stage jobs read the validated config from here


def test_digests_follow_what_they_describe(tmp_path: Path) -> None:
    a = WorkflowPlan.from_snakemake_config(data(tmp_path))
    changed = data(tmp_path)
    changed["agents"]["expert"]["temperature"] = 0.7
    b = WorkflowPlan.from_snakemake_config(changed)
    assert a.agent_digest("expert") != b.agent_digest("expert")
    assert a.suite_digest("starter") == b.suite_digest("starter")
    assert a.code == b.code and len(set(a.code.values())) > 3  # stages have distinct code digests


def test_include_of_a_missing_problem_is_named(tmp_path: Path) -> None:
    bad = data(tmp_path)
    bad["suites"]["starter"]["include"] = ["softmax_rows", "no_such_problem"]
    with pytest.raises(ConfigError, match="no_such_problem"):
        WorkflowPlan.from_snakemake_config(bad)


def test_missing_suite_folder_is_named(tmp_path: Path) -> None:
    bad = data(tmp_path)
    bad["suites"]["starter"] = {"path": str(tmp_path / "nowhere")}
    with pytest.raises(ConfigError, match="does not exist"):
        WorkflowPlan.from_snakemake_config(bad)


def test_transfer_makes_round_zero_wait_for_the_source_platform(tmp_path: Path) -> None:
    import subprocess
    import sys

    import yaml

    config = data(tmp_path)
    config["store"] = "artifacts"
    config["transfer"] = {"enabled": True, "source_platform": "cpu"}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "artifacts/runs/expert/triton/starter/softmax_rows/r0/kernel.py",
         "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path), "-n",
         "--configfile", str(tmp_path / "c.yaml")],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    planned = proc.stdout + proc.stderr
    assert "rule select:" in planned  # the cpu platform's best kernel comes first
    assert "runs/expert/cpu/starter/softmax_rows/best.json" in planned
