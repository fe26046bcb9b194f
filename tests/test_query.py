"""`kforge query`: DuckDB views over every table of a run, --csv/--json/--schema, and the five
example queries the README documents."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kforge.query import TABLE_VIEWS, TOP_VIEWS, run_query
from tests.report_fixtures import build_run

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_run(tmp_path_factory.mktemp("query")).root


def kforge(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kforge.cli", "query", *args, "--store", str(root)],
                          capture_output=True, text=True)


def readme_queries() -> list[str]:
    """The queries docs/USAGE.md shows (the README's "what to do next" points there)."""
    text = (REPO / "docs" / "USAGE.md").read_text()
    section = text.split("## Querying, shipping and the HTML report", 1)[1].split("\n## ", 1)[0]
    return re.findall(r'^kforge query "([^"]+)"$', section, re.M)


def test_every_view_is_there(root: Path) -> None:
    proc = kforge(root, "--schema")
    assert proc.returncode == 0, proc.stderr
    for name in (*TOP_VIEWS, *TABLE_VIEWS):
        assert re.search(rf"^{name} \(\d+ rows\): ", proc.stdout, re.M), name
    assert "shipped_speedup DOUBLE" in proc.stdout and "fast_1_5 DOUBLE" in proc.stdout


def test_csv_and_json(root: Path) -> None:
    sql = "select problem, status from report where platform = 'cpu' and shipped order by problem"
    rows = list(csv.reader(io.StringIO(kforge(root, sql, "--csv").stdout)))
    assert rows == [["problem", "status"], ["gemm_gelu_scale", "shipped"], ["softmax_rows", "shipped"]]
    data = json.loads(kforge(root, sql, "--json").stdout)
    assert data == [{"problem": "gemm_gelu_scale", "status": "shipped"}, {"problem": "softmax_rows", "status": "shipped"}]


def test_bad_sql_is_an_error_not_a_traceback(root: Path) -> None:
    proc = kforge(root, "select nope from report")
    assert proc.returncode == 2 and "kforge query:" in proc.stderr and "Traceback" not in proc.stderr


def test_the_five_readme_queries_answer(root: Path) -> None:
    queries = readme_queries()
    assert len(queries) == 5
    for sql in queries:
        columns, rows = run_query(root, sql)
        assert columns and rows, sql
