"""Shared helpers for the verifier tests: a fixture problem, a verify shortcut, and the
no-process-left-behind assertion every sandbox test ends with."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kforge.schema import Verdict
from kforge.verifier.verify import run_verification

FIXTURES = Path(__file__).parent / "fixtures"
SCALE_TANH = FIXTURES / "scale_tanh.py"
REPO = Path(__file__).resolve().parents[2]
SOFTMAX = REPO / "problems" / "starter" / "softmax_rows.py"

HONEST = '''
import torch
import torch.nn as nn
from torch.profiler import record_function


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        with record_function("kforge::scale_tanh"):
            z = x * 2.0 + 1.0
            e = torch.exp(-2.0 * z.abs())
            return torch.sign(z) * (1.0 - e) / (1.0 + e)
'''


def honest_with(body: str, header: str = "") -> str:
    """The honest candidate with extra module code ``header`` and forward ``body`` lines
    (``y`` holds the honest result; the body must return something)."""
    return f'''
import torch
import torch.nn as nn
from torch.profiler import record_function
{header}

def _honest(x):
    z = x * 2.0 + 1.0
    e = torch.exp(-2.0 * z.abs())
    return torch.sign(z) * (1.0 - e) / (1.0 + e)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        with record_function("kforge::scale_tanh"):
            y = _honest(x)
{body}
'''


def _ppid(pid: int) -> int:
    try:
        return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _descends_from_me(pid: int) -> bool:
    me = os.getpid()
    for _ in range(64):
        pid = _ppid(pid)
        if pid == me:
            return True
        if pid <= 1:
            return False
    return False


def worker_processes(marker: str = "kforge.verifier.worker", mine_only: bool = True) -> list[int]:
    """Processes whose command line holds ``marker``; by default only this test process's
    descendants (other engineers' pipelines may run verifiers on the same host)."""
    found = []
    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or entry.name == me:
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd and (not mine_only or _descends_from_me(int(entry.name))):
            found.append(int(entry.name))
    return found


def assert_nothing_left(marker: str = "kforge.verifier.worker", *, unique: bool = False) -> None:
    """No process of ours left; with ``unique`` the marker is ours alone, so any process on the
    host holding it (an escaped, re-parented survivor) counts."""
    left = worker_processes(marker, mine_only=not unique)
    assert left == [], f"processes left behind: {left}"


def verify(source: str, problem: Path = SCALE_TANH, **kw: object) -> Verdict:
    kw.setdefault("platform", "cpu")
    kw.setdefault("policy", "strict")
    kw.setdefault("timeout_s", 60)
    verdict = run_verification(source, problem, **kw)  # type: ignore[arg-type]
    assert_nothing_left()
    return verdict


@pytest.fixture(autouse=True, scope="session")
def _reference_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    old = os.environ.get("KFORGE_REFERENCE_CACHE")
    os.environ["KFORGE_REFERENCE_CACHE"] = str(tmp_path_factory.mktemp("refcache"))
    yield
    if old is None:
        os.environ.pop("KFORGE_REFERENCE_CACHE", None)
    else:
        os.environ["KFORGE_REFERENCE_CACHE"] = old
