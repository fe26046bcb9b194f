"""Session-wide hooks.

- The expert's coverage sample (``tests/test_expert_coverage.COVERAGE``) is printed in the
  terminal summary; under pytest-xdist each row travels from its worker in the test's report.
- Files with a ``slow`` test are collected first (the longest work starts first), ``exclusive``
  files last.
- Under pytest-xdist (``.ci/run`` runs two workers, a file to a worker), a test file marked
  ``exclusive`` (its assertions rest on timings or wall-clock bounds) runs while no other file
  does: every file holds a share of one lease for its whole run (module fixtures included), an
  exclusive file the whole lease (``kforge.verifier.device_lease.DeviceLease``: readers queue
  behind a waiting writer). The pipeline's own host lease is another file: a test file's share
  never blocks a timing window of a pipeline it runs.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SUMMARY: list[str] = []  # coverage rows, gathered where the reports arrive


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with a ``slow`` test (a pipeline run: minutes) first, ``exclusive`` files last, the
    rest in their order between: with a file to a worker, the long ones start at once instead of
    ending the run on one worker while the other idles, and an exclusive file waits only for the
    short file the other worker ends on (in the middle it waited behind whatever long file the
    other worker had, and that worker's next file behind it)."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    alone = {item.path for item in items if item.get_closest_marker("exclusive") is not None}
    items.sort(key=lambda item: 2 if item.path in alone else 0 if item.path in slow else 1)  # stable


@pytest.fixture(autouse=True, scope="module")
def _test_file_share(request: pytest.FixtureRequest) -> Iterator[None]:
    workerinput = getattr(request.config, "workerinput", None)
    if workerinput is None:  # no xdist: one file at a time anyway
        yield
        return
    from kforge.verifier.device_lease import DeviceLease

    path = Path(tempfile.gettempdir()) / f"kforge-tests-{os.getuid()}-{workerinput['testrunuid']}.lock"
    lease = DeviceLease(path)
    if request.node.get_closest_marker("exclusive") is not None:
        lease.exclusive()
    else:
        lease.shared()
    try:
        yield
    finally:
        lease.release()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    coverage = sys.modules.get("tests.test_expert_coverage")
    rows = getattr(coverage, "COVERAGE", None)
    if rows:
        report = outcome.get_result()
        report.user_properties.extend(("expert_coverage", row) for row in rows)
        rows.clear()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    SUMMARY.extend(str(v) for k, v in report.user_properties if k == "expert_coverage")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if SUMMARY:
        ok = sum(r.endswith(": ok") for r in SUMMARY)
        terminalreporter.write_sep("-", f"expert coverage sample: {ok}/{len(SUMMARY)} verified")
        for row in SUMMARY:
            terminalreporter.write_line(row)
