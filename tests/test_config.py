from __future__ import annotations

from pathlib import Path

import pytest

from kforge.config import ConfigError, load_config, parse_config

REPO = Path(__file__).resolve().parents[1]


def minimal() -> dict:
    return {
        "agents": {"expert": {"kind": "expert"}},
        "suites": {"starter": {"path": "problems/starter"}},
        "run": {"agents": ["expert"], "platforms": ["cpu"], "suites": ["starter"]},
    }


def test_repo_default_config_is_valid() -> None:
    config = load_config(REPO / "kforge.yaml")
    assert config.run.agents == ["expert"]
    assert config.rounds.total == 1 + config.rounds.functional + config.rounds.optimization


def test_unknown_top_level_key_is_named() -> None:
    data = minimal() | {"polcy": "strict"}
    with pytest.raises(ConfigError, match="unknown key 'polcy'"):
        parse_config(data)


def test_unknown_nested_key_is_named_with_its_place() -> None:
    data = minimal()
    data["agents"]["expert"]["temprature"] = 0.5
    with pytest.raises(ConfigError, match=r"unknown key 'agents\.expert\.temprature'"):
        parse_config(data)


def test_bad_value_names_the_key() -> None:
    data = minimal() | {"policy": "loose"}
    with pytest.raises(ConfigError, match="'policy'"):
        parse_config(data)


def test_run_must_name_defined_agents_and_suites() -> None:
    data = minimal()
    data["run"]["agents"] = ["gpt"]
    with pytest.raises(ConfigError, match="run.agents names 'gpt'"):
        parse_config(data)


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("agents: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_digest_changes_only_with_the_named_section() -> None:
    a = parse_config(minimal())
    data = minimal() | {"policy": "relaxed"}
    b = parse_config(data)
    assert a.digest("rounds") == b.digest("rounds")
    assert a.digest("policy") != b.digest("policy")
