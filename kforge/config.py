"""The KForge configuration file (``kforge.yaml``), validated by pydantic.

Unknown or misspelt keys are errors that name the key and its place, so a typo never silently
falls back to a default. Snakemake reads the same file; rules pass ``Config`` digests, never
objects, as ``params``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from kforge.schema import Policy

DEFAULT_CONFIG = Path("kforge.yaml")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AgentConfig(Strict):
    """One agent. ``kind: expert`` is the embedded deterministic agent; ``kind: litellm``
    calls any model litellm supports (hosted or a local OpenAI-compatible server).

    Request settings are *intents*: ``kforge.llm_request`` sends each only where litellm's
    tables say the model takes it (no ``seed`` to Claude, no ``temperature=0`` to a reasoning
    model). ``None`` for ``max_tokens`` / ``timeout_s`` means sized for the model: larger for
    reasoning models, whose hidden tokens count against ``max_tokens`` too."""

    kind: Literal["expert", "litellm"]
    model: str = "kforge/expert-v1"
    api_base: str | None = None
    api_key_env: str | None = None  # name of the environment variable holding the key
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    max_tokens: int | None = Field(None, ge=256)  # None: 8192, or 32768 for reasoning models
    seed: int | None = 0
    timeout_s: float | None = Field(None, gt=0)  # None: 120 s, or 600 s for reasoning models
    num_retries: int = Field(3, ge=0, le=10)
    concurrency: int = Field(4, ge=1)
    input_cost_per_token: float | None = Field(None, ge=0)  # price override (USD); local: 0
    output_cost_per_token: float | None = Field(None, ge=0)
    supports_images: bool | None = None  # None: litellm's supports_vision decides
    response_format: bool = True  # ask for structured analysis output where supported
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    thinking_budget_tokens: int | None = Field(None, ge=1024)  # Claude / Gemini thinking
    drop_params: bool = False  # let litellm drop what its tables say the model refuses
    stream: bool = False  # stream the reply (long answers outlive a read timeout)
    samples: int = Field(1, ge=1, le=16)  # candidates requested per generation round
    sample_temperature: float = Field(0.8, ge=0.0, le=2.0)  # samples after the first
    reasks: int = Field(1, ge=0, le=3)  # re-asks with the parse error before giving up
    budget_usd: float | None = Field(None, ge=0)  # spend cap for this agent on this store

    @model_validator(mode="after")
    def _consistent(self) -> AgentConfig:
        if self.thinking_budget_tokens is not None and self.max_tokens is not None:
            if self.thinking_budget_tokens >= self.max_tokens:
                raise ValueError(
                    f"thinking_budget_tokens ({self.thinking_budget_tokens}) must be below "
                    f"max_tokens ({self.max_tokens}): the answer needs room after the thinking"
                )
        if self.thinking_budget_tokens is not None and self.reasoning_effort is not None:
            raise ValueError("set reasoning_effort or thinking_budget_tokens, not both")
        return self


class SuiteConfig(Strict):
    path: str
    preset: Literal["ci", "full", "none"] = "ci"
    include: list[str] | None = None  # problem names (file stems); None = every *.py
    sizes: dict[str, int] = Field(default_factory=dict)  # explicit size-constant overrides


class RoundsConfig(Strict):
    """Round budgets. The pipeline runs ``1 + functional + optimization`` rounds at most: a
    repair round spends the functional budget, an optimisation round the other."""

    functional: int = Field(2, ge=0, le=20)
    optimization: int = Field(2, ge=0, le=20)

    @property
    def total(self) -> int:
        return 1 + self.functional + self.optimization


class VerifyConfig(Strict):
    """``preset: suite`` (the default) verifies at the sizes the suite times; CUDA candidates'
    outputs are then compared on the GPU (``compare: auto``), so GB-scale outputs never travel.
    ``preset: ci`` verifies at the small sizes while timing uses the suite's preset.

    ``sanitizer: [memcheck, racecheck]`` runs each listed compute-sanitizer tool on a CUDA
    candidate that passed (one more sandboxed run per tool, several times slower); a finding
    fails the verdict with ``sanitizer_memcheck`` / ``sanitizer_racecheck`` and the findings as
    repair feedback. Off (``[]``) by default; ignored on CPU platforms."""

    preset: Literal["suite", "ci"] = "suite"
    # auto: a CUDA candidate's outputs are compared on the device by a trusted judge over CUDA
    # IPC (kforge/verifier/gpu_compare.py), anything else as bytes in the parent; host: always
    # as bytes (for a host without CUDA IPC; pair it with preset: ci for GPU-scale outputs)
    compare: Literal["auto", "host", "device"] = "auto"
    trials: int = Field(3, ge=1)
    timeout_s: float = Field(120.0, gt=0)
    memory_mb: int = Field(4096, ge=256)
    sanitizer: list[Literal["memcheck", "racecheck"]] = Field(default_factory=list)

    @field_validator("sanitizer")
    @classmethod
    def _no_repeats(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("list each compute-sanitizer tool once")
        return value


class ProfileConfig(Strict):
    warmup: int = Field(3, ge=0)
    # repetitions per callable: the ship rule's bound is an order statistic of the paired ratios,
    # so more reps tighten it (n = 20: the 6th smallest of 20; n = 50: the 19th of 50)
    reps: int = Field(50, ge=3)
    timeout_s: float = Field(300.0, gt=0)
    # CPU threads for candidate and baselines alike (None: every core but one, which the parent's
    # clock, the scheduler and the OS use: on the 2-core dev host two threads timed a 3 ms GEMM
    # with a CV of 30-45%, one thread with 4%)
    threads: int | None = None
    ncu: bool = False  # Nsight Compute metrics for GPU candidates when ncu is on the PATH
    # select times torch.compile of the reference beside eager. false: eager only (quick runs,
    # CPU hosts where inductor's compile costs ~20 s a problem); the report's compile columns
    # stay empty, every row's detail says so, and the ship rule compares with eager alone.
    compile_baseline: bool = True


def known_platform(name: str) -> str:
    """``name`` if it names a platform: one of ``kforge.platforms.KNOWN_PLATFORMS``, or a dotted
    module path to an adapter outside kforge (imported when first used)."""
    from kforge.platforms import KNOWN_PLATFORMS  # here, so that importing the config stays light

    if name in KNOWN_PLATFORMS or ("." in name and all(part.isidentifier() for part in name.split("."))):
        return name
    raise ValueError(f"unknown platform {name!r}; the platforms are {', '.join(KNOWN_PLATFORMS)} "
                     "(or a dotted module path to an adapter of your own; `kforge platforms` lists them)")


PlatformName = Annotated[str, AfterValidator(known_platform)]


class TransferConfig(Strict):
    enabled: bool = False
    source_platform: PlatformName = "cpu"


class RunConfig(Strict):
    agents: list[str]
    platforms: list[PlatformName]
    suites: list[str]


class Config(Strict):
    store: str = "artifacts"
    policy: Policy = "strict"
    agents: dict[str, AgentConfig]
    suites: dict[str, SuiteConfig]
    run: RunConfig
    rounds: RoundsConfig = Field(default_factory=RoundsConfig)
    verify: VerifyConfig = Field(default_factory=VerifyConfig)
    profile: ProfileConfig = Field(default_factory=ProfileConfig)
    transfer: TransferConfig = Field(default_factory=TransferConfig)

    @field_validator("agents", "suites")
    @classmethod
    def _names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if not name.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"name {name!r} may hold only letters, digits, '-' and '_'")
        return value

    @model_validator(mode="after")
    def _run_refers_to_known_names(self) -> Config:
        for agent in self.run.agents:
            if agent not in self.agents:
                raise ValueError(f"run.agents names {agent!r}, not defined under agents:")
        for suite in self.run.suites:
            if suite not in self.suites:
                raise ValueError(f"run.suites names {suite!r}, not defined under suites:")
        return self

    def digest(self, *parts: str) -> str:
        """sha256 of the named top-level sections (all when none): a Snakemake ``params`` value."""
        data = self.model_dump(mode="json")
        chosen = {k: data[k] for k in parts} if parts else data
        return hashlib.sha256(json.dumps(chosen, sort_keys=True).encode()).hexdigest()


class ConfigError(ValueError):
    """The configuration file is missing, not YAML, or not valid; the message says where."""


def _where(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a key path: ``run.platforms[0]``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _explain(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = _where(e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            lines.append(f"unknown key '{where}'")
        else:
            lines.append(f"'{where}': {msg}")
    return "; ".join(lines)


def parse_config(data: Any, source: str = "<config>") -> Config:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the configuration must be a mapping, got {type(data).__name__}")
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{source}: {_explain(err)}") from None


def _yaml_problem(err: yaml.YAMLError) -> str:
    """PyYAML's several-line message as one line: the problem and where it is."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or " ".join(str(err).split())
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else problem


def load_config(path: Path | str = DEFAULT_CONFIG) -> Config:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"configuration file {path} not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {_yaml_problem(err)}") from None
    return parse_config(data, str(path))
