"""A problem file that does not load is nobody's candidate: the pipeline asks no agent, verifies and
times nothing, and its row says ``problem_error: <the problem's own error>`` on one line;
``kforge verify CANDIDATE --problem BROKEN.py`` says so in one line with exit status 9."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from kforge.problems import one_line
from tests.pipeline_helpers import REPO, ledger, snakemake, write_config

GOOD = (REPO / "problems" / "starter" / "softmax_rows.py").read_text()
BROKEN = {
    # raises at import
    "raises_at_import": GOOD.replace("\nclass Model", '\nraise RuntimeError("needs a dataset that is not here")\n\n'
                                     "class Model", 1),
    # not valid Python
    "syntax_error": GOOD.replace("def get_inputs():", "def get_inputs(:", 1),
    # get_inputs() raises
    "inputs_raise": GOOD.replace("def get_inputs():", 'def get_inputs():\n    raise ValueError("no inputs today")\n\n\n'
                                 "def _unused():", 1),
}
WHY = {
    "raises_at_import": "problem_error: import_error: RuntimeError: needs a dataset that is not here",
    "syntax_error": "problem_error: import_error: SyntaxError: ",
    "inputs_raise": "problem_error: bad_inputs: get_inputs() raised ValueError: no inputs today",
}


def test_the_broken_problems_are_what_they_say() -> None:
    from kforge.problems import ProblemError, load_problem_source

    load_problem_source(GOOD, "good")
    load_problem_source(CPU_PROBLEM, "cpu")
    for name, source in [*BROKEN.items(), *CPU_BROKEN.items()]:
        with pytest.raises(ProblemError):
            load_problem_source(source, name)


def test_one_line_keeps_a_tracebacks_last_line_and_is_short() -> None:
    text = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n    boom()\nValueError: boom\n'
    assert one_line(text) == "ValueError: boom"
    assert one_line("a\n  b\tc") == "a b c"
    assert len(one_line("x" * 1000)) == 300 and one_line("x" * 1000).endswith("...")


@pytest.mark.slow
def test_the_pipeline_reports_problem_error_and_asks_no_agent(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    for name, source in BROKEN.items():
        (suite / f"{name}.py").write_text(source)
    write_config(tmp_path, suites={"broken": {"path": str(suite), "preset": "ci"}},
                 run={"agents": ["expert"], "platforms": ["cpu"], "suites": ["broken"]},
                 rounds={"functional": 1, "optimization": 0})  # a repair round, and torch.compile warmed
    snakemake(tmp_path)
    report = tmp_path / "artifacts" / "report.parquet"
    rows = dict(duckdb.sql(f"select problem, status || ' | ' || detail from '{report}'").fetchall())
    assert set(rows) == set(BROKEN)
    for name, row in rows.items():
        status, detail = row.split(" | ", 1)
        assert status == "failed" and detail.startswith(WHY[name]), (name, detail)
        assert "\n" not in detail and "no agent was asked" in detail and "no_candidate" not in detail
    work = [e["stage"] for e in ledger(tmp_path)]
    assert "agent_call" not in work and "verify" not in work and "profile" not in work, work
    warm = json.loads((tmp_path / "artifacts" / "warm" / "cpu" / "broken.json").read_text())["problems"]
    assert set(warm) == set(BROKEN)
    for name in BROKEN:
        assert warm[name]["skipped"].startswith("the problem does not load: ")


# the cpu platform's one-shot pair: a candidate that builds and verifies against its problem
CPU_PROBLEM = (REPO / "refs" / "cpu" / "problem.py").read_text()
CPU_SOLUTION = (REPO / "refs" / "cpu" / "solution.py").read_text()
CPU_BROKEN = {
    "raises_at_import": CPU_PROBLEM.replace("\nclass Model", '\nraise RuntimeError("needs a dataset that is not '
                                            'here")\n\nclass Model', 1),
    "inputs_raise": CPU_PROBLEM.replace("def get_inputs():", 'def get_inputs():\n    raise ValueError("no inputs '
                                        'today")\n\n\ndef _unused():', 1),
    "syntax_error": CPU_PROBLEM.replace("def get_inputs():", "def get_inputs(:", 1),
}


def _verify(tmp_path: Path, problem_source: str) -> subprocess.CompletedProcess[str]:
    problem = tmp_path / "problem.py"
    problem.write_text(problem_source)
    candidate = tmp_path / "cand.py"
    candidate.write_text(CPU_SOLUTION)
    return subprocess.run([sys.executable, "-m", "kforge.cli", "verify", str(candidate), "--problem", str(problem),
                           "--build-dir", str(tmp_path / "build")], capture_output=True, text=True, timeout=300)


def test_kforge_verify_of_the_intact_pair_verifies(tmp_path: Path) -> None:
    proc = _verify(tmp_path, CPU_PROBLEM)
    assert proc.returncode == 0 and proc.stdout.startswith("VERIFIED"), proc.stdout + proc.stderr


@pytest.mark.parametrize("name", ["raises_at_import", "inputs_raise"])
def test_kforge_verify_names_the_problems_error_exit_9(tmp_path: Path, name: str) -> None:
    proc = _verify(tmp_path, CPU_BROKEN[name])
    assert proc.returncode == 9, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr and proc.stdout == ""
    why = WHY[name].removeprefix("problem_error: ")
    assert proc.stderr.startswith(f"kforge verify: problem file {tmp_path / 'problem.py'} does not load: {why}")


def test_kforge_verify_of_a_problem_that_is_not_python_stays_exit_8(tmp_path: Path) -> None:
    proc = _verify(tmp_path, CPU_BROKEN["syntax_error"])
    assert proc.returncode == 8 and proc.stderr.count("\n") == 1 and "not valid Python" in proc.stderr
