"""The one-node localhost cluster (scripts/cluster/localslurm.py) as a pytest fixture."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_localslurm() -> ModuleType:
    """scripts/cluster/localslurm.py is a standalone script (no package): load it by path."""
    path = REPO / "scripts" / "cluster" / "localslurm.py"
    spec = importlib.util.spec_from_file_location("localslurm", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["localslurm"] = module  # dataclasses look the module up while the class is built
    spec.loader.exec_module(module)
    return module


localslurm = load_localslurm()
TIMES: dict[str, float] = {}  # seconds, printed in the terminal summary


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TIMES:
        parts = ", ".join(f"{k} {v:.0f} s" for k, v in TIMES.items())
        terminalreporter.write_sep("-", f"slurm cluster test: {parts}")


@pytest.fixture(scope="module")
def cluster() -> Iterator[localslurm.LocalSlurm]:
    """A running cluster for the module; stopped at the end if a test has not done so. Its
    state folder is removed when everything stopped cleanly and kept (logs) otherwise."""
    why = localslurm.missing_requirements()
    if why:
        pytest.skip(f"Slurm daemons cannot start here: {why}")
    # Not under /tmp: munged and mariadbd (other users) must reach the folder, and pytest's
    # /tmp/pytest-of-root is private to root.
    state = Path(tempfile.mkdtemp(prefix="kforge-slurm-", dir="/var/tmp"))
    instance = localslurm.LocalSlurm(state)
    start = time.perf_counter()
    instance.start()
    TIMES["cluster up"] = time.perf_counter() - start
    yield instance
    leftovers = instance.stop()
    if not leftovers and not instance.pids:
        shutil.rmtree(state, ignore_errors=True)
