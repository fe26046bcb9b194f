"""Fixtures for the LLM tests: a store per test and a scripted server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kforge.store import Store

from .server import ScriptedServer


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "artifacts")


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as srv:
        yield srv
