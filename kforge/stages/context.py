"""What every stage job shares: the resolved config, the store, run paths, code digests and the
work ledger (one line per unit of real work, which tests count to prove caching)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from kforge.config import Config, parse_config
from kforge.store import Store, atomic_write, canonical_json, digest_of

PACKAGE_DIR = Path(__file__).resolve().parents[1]

# Which package files each stage's behaviour depends on (globs relative to kforge/). Their
# digest is part of the stage's action key and of its Snakemake params.
STAGE_CODE: dict[str, tuple[str, ...]] = {
    "problem": ("problems.py", "problem_cost.py", "stages/problem.py"),
    "example": ("platforms/*.py", "stages/example.py"),
    "generate": ("agents/**/*.py", "llm*.py", "problems.py", "stages/generate.py", "stages/agent_calls.py",
                 "stages/problem.py"),
    "compile": ("platforms/*.py", "stages/compile.py"),
    "verify": ("verifier/*.py", "platforms/*.py", "problems.py", "problem_cost.py", "stages/verify.py",
               "stages/problem.py"),
    "profile": ("verifier/*.py", "platforms/*.py", "problems.py", "problem_cost.py", "stages/profile.py", "stages/warm.py"),
    "analyze": ("agents/**/*.py", "llm*.py", "stages/analyze.py", "stages/agent_calls.py"),
    "select": ("verifier/*.py", "platforms/*.py", "problems.py", "problem_cost.py", "stages/select.py", "stages/warm.py"),
    "warm": ("verifier/*.py", "platforms/*.py", "problems.py", "stages/warm.py", "stages/problem.py"),
}
STAGE_CODE["refine"] = STAGE_CODE["generate"] + ("stages/refine.py",)

R = TypeVar("R", bound=BaseModel)


def code_digest(stage: str) -> str:
    """sha256 over the package files a stage runs (sorted by path)."""
    h = hashlib.sha256()
    files: set[Path] = set()
    for pattern in STAGE_CODE[stage] + ("stages/context.py", "stages/records.py", "schema.py", "store.py"):
        files.update(PACKAGE_DIR.glob(pattern))
    for path in sorted(files):
        if path.is_file():
            h.update(str(path.relative_to(PACKAGE_DIR)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def resolved_config_path(config: Config) -> Path:
    """Write the validated config once, by content, where stage jobs can read it."""
    data = canonical_json(config)
    path = Path(config.store) / "config" / f"{hashlib.sha256(data).hexdigest()}.json"
    if not path.is_file():
        atomic_write(path, data)
    return path


@dataclass
class StageContext:
    config: Config
    store: Store

    @classmethod
    def from_file(cls, path: Path | str) -> StageContext:
        config = parse_config(json.loads(Path(path).read_text()), str(path))
        return cls(config=config, store=Store(config.store))

    @property
    def root(self) -> Path:
        return Path(self.config.store)

    @property
    def build_dir(self) -> Path:
        return self.root / "build"

    def suite_path(self, suite: str) -> Path:
        return Path(self.config.suites[suite].path)

    def problem_path(self, suite: str, problem: str) -> Path:
        return self.suite_path(suite) / f"{problem}.py"

    def action_key(self, stage: str, **parts: Any) -> str:
        return digest_of({"stage": stage, "code": code_digest(stage), **parts})

    def cached(self, key: str, model: type[R]) -> R | None:
        hit = self.store.action_get(key)
        return None if hit is None else model.model_validate(hit)

    def remember(self, key: str, record: BaseModel, blobs: list[str | None]) -> None:
        self.store.action_put(key, record.model_dump(mode="json"), [b for b in blobs if b])

    def ledger(self, stage: str, **fields: Any) -> None:
        """Append one line per unit of real (uncached) work: agent calls, builds, runs."""
        line = json.dumps({"stage": stage, "time": time.time(), "pid": os.getpid(), **fields}, sort_keys=True)
        path = self.root / "ledger.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)


def write_record(path: Path | str, record: BaseModel, store: Store) -> str:
    """Write a stage record to its Snakemake output path and into the store; return its digest."""
    data = canonical_json(record)
    atomic_write(Path(path), data)
    return store.put_bytes(data)


def read_record(path: Path | str, model: type[R]) -> R:
    return model.model_validate_json(Path(path).read_bytes())


def record_digest(path: Path | str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@contextmanager
def stopwatch() -> Iterator[list[float]]:
    box = [0.0]
    start = time.perf_counter()
    try:
        yield box
    finally:
        box[0] = time.perf_counter() - start
