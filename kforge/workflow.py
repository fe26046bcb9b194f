"""What the Snakefile needs at parse time, computed cheaply (no torch, no litellm): the validated
config, the (agent, platform, suite, problem) grid, rounds and the digests rules use as
``params`` so that code, prompt and config edits rerun exactly the stages they affect."""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kforge.agents.prompting import prompt_digest
from kforge.config import Config, ConfigError, parse_config
from kforge.platforms.base import REFS_DIR
from kforge.stages.context import code_digest, resolved_config_path

CONFIG_ERROR_EXIT = 2  # the status `kforge config` gives an invalid file


def plan_or_exit(data: dict[str, Any]) -> WorkflowPlan:
    """The Snakefile's plan. A config that is not valid ends the run with one line on stderr,
    ``kforge: <file>: '<key>': <what is wrong>``, and exit status :data:`CONFIG_ERROR_EXIT`:
    Snakemake prints nothing after a ``SystemExit`` raised while it parses the workflow (a
    ``ConfigError`` escaping would come with its traceback)."""
    try:
        return WorkflowPlan.from_snakemake_config(data)
    except ConfigError as err:
        print(f"kforge: {err}", file=sys.stderr, flush=True)
        raise SystemExit(CONFIG_ERROR_EXIT) from None


def _check_own_adapters(config: Config, source: str) -> None:
    """A platform given as a dotted module path must import (the rules read its refs folder
    while Snakemake builds the DAG): else a ConfigError naming the key."""
    from kforge.platforms import UnknownPlatformError, get_platform

    for i, name in enumerate(config.run.platforms):
        if "." in name:
            try:
                get_platform(name)
            except UnknownPlatformError as err:
                raise ConfigError(f"{source}: 'run.platforms[{i}]': {err.args[0]}") from None
            except ImportError as err:
                raise ConfigError(f"{source}: 'run.platforms[{i}]': the adapter module {name} does not import "
                                  f"({err}); is its package on PYTHONPATH?") from None


def suite_problems(config: Config, suite: str) -> list[str]:
    settings = config.suites[suite]
    folder = Path(settings.path)
    if not folder.is_dir():
        raise ConfigError(f"suites.{suite}.path: folder {folder} does not exist")
    found = sorted(p.stem for p in folder.glob("*.py") if not p.name.startswith("_"))
    if settings.include is None:
        return found
    missing = sorted(set(settings.include) - set(found))
    if missing:
        raise ConfigError(f"suites.{suite}.include names problems not in {folder}: {', '.join(missing)}")
    return [name for name in found if name in settings.include]


def folder_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")) if folder.is_dir() else []:
        if path.is_file():
            h.update(str(path.relative_to(folder)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


@dataclass
class WorkflowPlan:
    config: Config
    python: str = sys.executable
    resolved: str = ""
    grid: list[tuple[str, str, str, str]] = field(default_factory=list)
    problems: dict[str, list[str]] = field(default_factory=dict)  # suite -> its problems in this run
    code: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_snakemake_config(cls, data: dict[str, Any]) -> WorkflowPlan:
        source = "snakemake config (kforge.yaml + --configfile/--config)"
        config = parse_config(dict(data), source)
        _check_own_adapters(config, source)
        plan = cls(config=config)
        plan.resolved = str(resolved_config_path(config))
        problems = plan.problems = {suite: suite_problems(config, suite) for suite in config.run.suites}
        plan.grid = [
            (agent, platform, suite, problem)
            for agent in config.run.agents
            for platform in config.run.platforms
            for suite in config.run.suites
            for problem in problems[suite]
        ]
        plan.code = {stage: code_digest(stage) for stage in (
            "problem", "example", "generate", "refine", "compile", "verify", "profile", "analyze", "select", "warm")}
        return plan

    @property
    def root(self) -> str:
        return self.config.store

    @property
    def profile_baselines(self) -> str:
        """The policy the profiles time eager and torch.compile under, "" when they time the
        candidate alone (:func:`kforge.stages.profile.with_baselines`)."""
        from kforge.stages.profile import with_baselines

        return self.config.policy if with_baselines(self.config) else ""

    @property
    def last_round(self) -> int:
        return self.config.rounds.total - 1

    def run_dir(self, agent: str, platform: str, suite: str, problem: str) -> str:
        return f"{self.root}/runs/{agent}/{platform}/{suite}/{problem}"

    def round_dirs(self, agent: str, platform: str, suite: str, problem: str) -> list[str]:
        base = self.run_dir(agent, platform, suite, problem)
        return [f"{base}/r{r}" for r in range(self.config.rounds.total)]

    def selections(self) -> list[str]:
        return [f"{self.run_dir(*cell)}/best.json" for cell in self.grid]

    def records(self) -> list[str]:
        names = ("candidate.json", "compile.json", "verify.json", "profile.json", "analysis.json")
        return [f"{d}/{n}" for cell in self.grid for d in self.round_dirs(*cell) for n in names]

    # ------------------------------------------------------------------ params (digests)
    def agent_digest(self, agent: str) -> str:
        return hashlib.sha256(self.config.agents[agent].model_dump_json().encode()).hexdigest()

    def suite_digest(self, suite: str) -> str:
        return hashlib.sha256(self.config.suites[suite].model_dump_json().encode()).hexdigest()

    def settings_digest(self, *sections: str) -> str:
        return self.config.digest(*sections)

    def generate_prompts(self) -> str:
        return prompt_digest("system", "generate")

    def analyze_prompts(self) -> str:
        return prompt_digest("system", "analyze")

    def refs_digest(self, platform: str) -> str:
        folder = REFS_DIR / platform
        if not folder.is_dir():  # a platform from outside this package names its own folder
            from kforge.platforms import get_platform

            folder = Path(getattr(get_platform(platform), "refs_dir", folder))
        return folder_digest(folder)
