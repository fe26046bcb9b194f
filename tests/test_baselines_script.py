"""benchmarks/baselines.py end to end on the CPU: compile warm-up workers, then timing; one
broken problem gives a row with a note, never stops the others, and makes the exit status 1."""

from __future__ import annotations

import csv
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "baselines.py"
STARTER = ROOT / "problems" / "starter"
FAST = ["--preset", "ci", "--reps", "3", "--min-sample-ms", "0.5", "--threads", "1"]

BROKEN_INPUTS = """
import torch
import torch.nn as nn

batch_size = 64


class Model(nn.Module):
    def forward(self, x):
        return x + 1


def get_inputs():
    raise ValueError("no inputs today")


def get_init_inputs():
    return []
"""

# Loads (its forward runs on meta, where sizes and costs are measured), then fails for real.
BROKEN_FORWARD = """
import torch
import torch.nn as nn

batch_size = 64


class Model(nn.Module):
    def forward(self, x):
        if x.device.type != "meta":
            raise RuntimeError("boom at run time")
        return x + 1


def get_inputs():
    return [torch.randn(batch_size, 32)]


def get_init_inputs():
    return []
"""


@pytest.fixture(scope="module")
def inductor_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh inductor cache shared by this module's runs (cold at the first one)."""
    return tmp_path_factory.mktemp("inductor_cache")


def run_script(args: list[str], cache: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache))
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def table_rows(markdown: str) -> dict[str, list[str]]:
    """Problem name -> cells of its row in the report's table."""
    rows: dict[str, list[str]] = {}
    for line in markdown.splitlines():
        if not line.startswith("| ") or line.startswith("| problem |"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0]] = cells
    return rows


def finite(cell: str) -> bool:
    try:
        return math.isfinite(float(cell))
    except ValueError:
        return False


def test_compile_workers_prewarm_then_time(tmp_path: Path, inductor_cache: Path) -> None:
    names = ["elementwise_gelu_scale", "softmax_rows"]
    md = tmp_path / "tmp.md"
    args = ["--suite", str(STARTER), "--include", *names, *FAST]
    proc = run_script([*args, "--compile-workers", "2", "--markdown", str(md)], inductor_cache)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = md.read_text()
    rows = table_rows(text)
    assert sorted(rows) == names
    for name in names:
        cells = rows[name]
        assert finite(cells[2]) and finite(cells[4]), cells  # eager ms, compile ms
        assert cells[-1] == "", cells  # no note
    assert "- compile warm-up: 2 workers," in text
    assert "2/2 problems warmed" in text
    # The workers filled the on-disk caches: this process's compiles were all hits.
    assert "FX graph cache 2 hits, 0 misses" in text, text
    assert "partial report" not in text
    assert not list(tmp_path.glob("*.tmp"))


def test_broken_problems_get_a_row_and_exit_1(tmp_path: Path, inductor_cache: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(STARTER / "softmax_rows.py", suite / "softmax_rows.py")
    (suite / "broken_forward.py").write_text(BROKEN_FORWARD)
    (suite / "broken_inputs.py").write_text(BROKEN_INPUTS)
    md, out = tmp_path / "tmp.md", tmp_path / "tmp.csv"
    args = ["--suite", str(suite), *FAST, "--markdown", str(md), "--out", str(out)]
    proc = run_script([*args, "--compile-workers", "1"], inductor_cache)
    assert proc.returncode == 1, proc.stdout + proc.stderr

    # load_suite reports a get_inputs() that raises as a load error (kind bad_inputs).
    assert "skipped: problem 'broken_inputs'" in proc.stderr
    assert "bad_inputs" in proc.stderr
    text = md.read_text()
    rows = table_rows(text)
    assert sorted(rows) == ["broken_forward", "broken_inputs", "softmax_rows"]
    good = rows["softmax_rows"]
    assert finite(good[2]) and finite(good[4]) and good[-1] == "", good
    assert rows["broken_inputs"][2] == "n/a"
    assert rows["broken_inputs"][-1].startswith("skipped: bad_inputs: get_inputs() raised")
    assert rows["broken_forward"][2] == "n/a"
    assert rows["broken_forward"][-1] == "failed: RuntimeError: boom at run time"
    assert "- failed: broken_forward: RuntimeError: boom at run time" in text
    assert "- skipped: problem 'broken_inputs'" in text
    # The warm-up worker failed on broken_forward too: reported, not fatal.
    assert "1 workers," in text and "1/2 problems warmed; failed: broken_forward" in text

    with out.open() as fh:
        csv_rows = {r["problem"]: r for r in csv.DictReader(fh)}
    assert sorted(csv_rows) == sorted(rows)
    assert math.isnan(float(csv_rows["broken_forward"]["eager_ms"]))
    assert math.isfinite(float(csv_rows["softmax_rows"]["compiled_ms"]))
