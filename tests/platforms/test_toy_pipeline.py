"""A platform added from outside the package runs through the whole pipeline.

The toy platform is one adapter module (a CPU C++ dialect that builds through the cpu
platform's compiler path) plus one refs folder, in a temporary package found on PYTHONPATH.
Its agent is an LLM served by the tests' scripted OpenAI-compatible server, which answers
with the one-shot example's own solution: the point is the platform plumbing, end to end.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tests.llm.server import Received, Reply, ScriptedServer, ok
from tests.llm.test_pipeline_llm import GOOD, PROBLEM
from tests.pipeline_helpers import REPO, snakemake, write_config

pytestmark = pytest.mark.slow

ADAPTER = '''
from __future__ import annotations

from pathlib import Path

from kforge.platforms.cpu import PLATFORM as CPU
from kforge.schema import BuildResult, PlatformInfo


class ToyPlatform:
    """A C++ dialect for the CPU: builds and runs like `cpu`, onboarded from one example."""

    name = "toypkg.toy"
    language = "toy C++"
    refs_dir = Path(__file__).parent / "refs"

    def describe(self) -> PlatformInfo:
        info = CPU.describe()
        return info.model_copy(update={"name": self.name, "language": self.language})

    def build(self, source: str, workdir: Path) -> BuildResult:
        return CPU.build(source, workdir)

    def device(self) -> str:
        return "cpu"

    def worker_env(self, build_dir: Path) -> dict[str, str]:
        return CPU.worker_env(build_dir)


PLATFORM = ToyPlatform()
'''


def make_toy_package(root: Path) -> None:
    pkg = root / "toypkg"
    (pkg / "refs").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "toy.py").write_text(textwrap.dedent(ADAPTER))
    (pkg / "refs" / "problem.py").write_text((REPO / "problems" / "starter" / f"{PROBLEM}.py").read_text())
    (pkg / "refs" / "solution.py").write_text(GOOD)
    (pkg / "refs" / "NOTES.md").write_text("Toy C++: extern \"C\" entry points called through cpu_runtime.\n")


def test_toy_platform_runs_through_the_pipeline(tmp_path: Path) -> None:
    root = tmp_path / "site"
    make_toy_package(root)

    def respond(request: Received) -> Reply:
        if "performance analyst" in request.user_text:
            return ok(json.dumps({"bottleneck": "memory", "evidence": {}, "actions": [], "summary": "done"}))
        assert "Toy C++" in request.user_text  # the platform's one-shot notes reach the prompt
        return ok(f"```python\n{GOOD}```\n")

    with ScriptedServer(responder=respond) as srv:
        workdir = tmp_path / "work"
        workdir.mkdir()
        write_config(
            workdir,
            eager_only=True,
            agents={"local": {"kind": "litellm", "model": "openai/toy", "api_base": srv.api_base,
                              "timeout_s": 30, "num_retries": 1}},
            suites={"one": {"path": str(REPO / "problems" / "starter"), "include": [PROBLEM]}},
            run={"agents": ["local"], "platforms": ["toypkg.toy"], "suites": ["one"]},
            rounds={"functional": 0, "optimization": 0},
        )
        snakemake(workdir, env={"PYTHONPATH": str(root)})
    import duckdb  # not on GPU hosts, where this module is still collected

    rows = duckdb.sql(f"select platform, verified, status from '{workdir / 'artifacts' / 'report.parquet'}'").fetchall()
    assert len(rows) == 1 and rows[0][:2] == ("toypkg.toy", True)
    assert rows[0][2] in ("shipped", "no_gain")  # verified and timed; shipped only if it beat the baselines
