"""Session-wide hooks: the expert's coverage sample is printed in the terminal summary."""

from __future__ import annotations

from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from tests import test_expert_coverage

    rows = getattr(test_expert_coverage, "COVERAGE", [])
    if rows:
        terminalreporter.write_sep("-", f"expert coverage sample: {sum(r.endswith(': ok') for r in rows)}/{len(rows)} verified")
        for row in rows:
            terminalreporter.write_line(row)
