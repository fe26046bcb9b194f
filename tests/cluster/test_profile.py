"""profiles/slurm without a cluster: what Snakemake makes of it for every rule (a dry run with
the slurm executor over a cpu + triton grid) and the sbatch line the pinned executor builds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from tests.pipeline_helpers import write_config

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "profiles" / "slurm"
DEVICE_RULES = ("example", "generate", "refine", "compile", "verify", "analyze", "profile", "peaks", "select",
                "warm")
CORES = 8


def parse_dry_run(text: str) -> list[dict[str, str]]:
    """One dict per job: rule, threads, wildcards and resources as printed by ``snakemake -n``."""
    jobs: list[dict[str, str]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if (line.startswith("rule ") or line.startswith("localrule ")) and line.endswith(":"):
            jobs.append({"rule": line.split()[1].rstrip(":")})
        elif jobs and ": " in line and not line.startswith("["):
            key, value = line.split(": ", 1)
            if key in ("threads", "wildcards", "resources"):
                jobs[-1][key] = value
    return jobs


def fields(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split(", ")) if text else {}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], str]:
    workdir = tmp_path_factory.mktemp("slurm-dry-run")
    write_config(workdir, suites={"tiny": {"path": str(REPO / "problems" / "starter"), "preset": "ci",
                                           "include": ["softmax_rows"]}},
                 run={"agents": ["expert"], "platforms": ["cpu", "triton"], "suites": ["tiny"]},
                 rounds={"functional": 0, "optimization": 1})
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
         "--configfile", str(workdir / "kforge.yaml"), "--profile", str(PROFILE), "--cores", str(CORES),
         "--dry-run", "artifacts/report.parquet"],
        cwd=workdir, capture_output=True, text=True, timeout=300, env=env,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    jobs = [{"rule": j["rule"], "threads": int(j.get("threads", "1")), "wildcards": fields(j.get("wildcards", "")),
             "resources": fields(j.get("resources", ""))} for j in parse_dry_run(out)]
    return jobs, out


def test_profile_settings() -> None:
    profile = yaml.safe_load((PROFILE / "config.yaml").read_text())
    assert profile["executor"] == "slurm"
    assert profile["latency-wait"] >= 30  # shared filesystem
    assert profile["retries"] >= 1 and profile["slurm-requeue"] is True  # preemption, lost nodes
    assert profile["jobs"] >= 10
    assert {"mem_mb", "runtime"} <= set(profile["default-resources"])


def test_device_jobs_of_gpu_platforms_ask_for_one_gpu_as_gres(dry_run: tuple[list[dict[str, Any]], str]) -> None:
    jobs, _ = dry_run
    seen = set()
    for job in jobs:
        platform = job["wildcards"].get("platform")
        if job["rule"] not in DEVICE_RULES or platform is None:
            continue
        seen.add((job["rule"], platform))
        gres = job["resources"].get("gres")
        assert gres == ("gpu:1" if platform == "triton" else ""), (job["rule"], platform, job["resources"])
        # the local `gpu` resource would become a second request (--gpus=1) beside the GRES
        assert job["resources"].get("gpu", "0") == "0", job
    assert {(r, p) for r in DEVICE_RULES for p in ("cpu", "triton")} <= seen


def test_whole_machine_jobs_are_exclusive_with_every_core(dry_run: tuple[list[dict[str, Any]], str]) -> None:
    jobs, _ = dry_run
    for job in jobs:
        exclusive = job["resources"].get("slurm_extra") == "--exclusive"
        assert exclusive == (job["rule"] in ("select", "peaks")), job
        if exclusive:  # Slurm binds the task to the CPUs it asked for: a CPU timing asks for the node's
            gpu_select = job["rule"] == "select" and job["wildcards"].get("platform") == "triton"
            assert job["threads"] == (4 if gpu_select else CORES), job
        if job["rule"] == "profile":
            assert job["threads"] == (4 if job["wildcards"]["platform"] == "triton" else CORES), job
    assert sum(j["rule"] == "select" for j in jobs) == 2
    assert sum(j["rule"] == "profile" for j in jobs) == 4  # two rounds of two cells


def test_round_loops_run_as_one_job_per_cell(dry_run: tuple[list[dict[str, Any]], str]) -> None:
    jobs, out = dry_run
    # the cpu and triton cells of the one problem; the warm jobs (one per platform x suite, shared
    # by the suite's cells) are jobs of their own
    assert out.count("Group job cell") == 2
    assert sum(j["rule"] == "warm" for j in jobs) == 2
    assert {j["rule"] for j in jobs} >= {"tables", "report"}  # local rules (the cluster test checks sacct)


def _fake_job(job: dict[str, Any]) -> SimpleNamespace:
    class Resources(dict[str, Any]):
        def __getattr__(self, name: str) -> Any:
            return self[name]

    values: dict[str, Any] = {k: int(v) if v.isdigit() else v for k, v in job["resources"].items() if "<TBD>" not in v}
    return SimpleNamespace(resources=Resources(values), threads=job["threads"], name=job["rule"])


def test_sbatch_line_of_the_pinned_executor(dry_run: tuple[list[dict[str, Any]], str]) -> None:
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    jobs, _ = dry_run
    params = {"run_uuid": "u", "slurm_logfile": "/dev/null", "comment_str": "c", "account": "", "partition": "",
              "workdir": "/work"}
    lines = {}
    for job in jobs:
        if job["rule"] in ("select", "verify") and job["wildcards"].get("platform"):
            fake = _fake_job(job)
            lines[(job["rule"], job["wildcards"]["platform"])] = get_submit_command(fake, params) + set_gres_string(fake)
    triton_select = lines[("select", "triton")]
    assert "--gres=gpu:1" in triton_select and "--gpus" not in triton_select
    assert "--exclusive" in triton_select and "--cpus-per-task=4" in triton_select
    assert "--gres" not in lines[("select", "cpu")] and "--exclusive" in lines[("select", "cpu")]
    assert f"--cpus-per-task={CORES}" in lines[("select", "cpu")]
    assert "--gres=gpu:1" in lines[("verify", "triton")] and "--exclusive" not in lines[("verify", "triton")]
    assert "--gres" not in lines[("verify", "cpu")]
