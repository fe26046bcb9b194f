"""A bad config ends `snakemake -n` (the Snakefile loads it through kforge.workflow.plan_or_exit)
with one line `kforge: ...` on stderr and exit status 2, not a Python or Snakemake traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipeline_helpers import REPO, write_config


def dry_run(workdir: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(workdir / "kforge.yaml"), "--cores", "1", "-n"]
    return subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=300, env=dict(os.environ))


@pytest.mark.parametrize(("overrides", "expect"), [
    ({"run": {"agents": ["expert"], "platforms": ["gpu9000"], "suites": ["tiny"]}},
     "'run.platforms[0]': unknown platform 'gpu9000'; the platforms are cpu, triton, cuda, metal"),
    ({"run": {"agents": ["expert"], "platforms": ["cpu"], "suites": ["tiny"], "bogus": 1}},
     "unknown key 'run.bogus'"),
    ({"run": {"agents": ["expert"], "platforms": ["nosuch.adapter"], "suites": ["tiny"]}},
     "'run.platforms[0]': the adapter module nosuch.adapter does not import"),
])
def test_bad_config_ends_a_dry_run_with_one_line(tmp_path: Path, overrides: dict, expect: str) -> None:
    write_config(tmp_path, **overrides)
    proc = dry_run(tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out and "Error in" not in out and "File \"" not in out, out
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("kforge: snakemake config") and expect in last, out
    assert sum(line.startswith("kforge:") for line in out.splitlines()) == 1


def test_good_config_dry_runs(tmp_path: Path) -> None:
    write_config(tmp_path)
    proc = dry_run(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
