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


def test_unknown_platform_names_the_key_and_the_platforms() -> None:
    from kforge.platforms import KNOWN_PLATFORMS

    data = minimal()
    data["run"]["platforms"] = ["cpu", "gpu9000"]
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    message = str(caught.value)
    assert "'run.platforms[1]': unknown platform 'gpu9000'" in message and "\n" not in message
    assert f"the platforms are {', '.join(KNOWN_PLATFORMS)}" in message


def test_unknown_transfer_platform_is_named() -> None:
    data = minimal() | {"transfer": {"enabled": True, "source_platform": "gpu9000"}}
    with pytest.raises(ConfigError, match=r"'transfer\.source_platform': unknown platform 'gpu9000'"):
        parse_config(data)


def test_a_dotted_adapter_path_is_a_platform() -> None:
    data = minimal()
    data["run"]["platforms"] = ["cpu", "mypkg.myplatform"]
    assert parse_config(data).run.platforms == ["cpu", "mypkg.myplatform"]


def test_importing_the_config_loads_no_platform_module() -> None:
    import subprocess
    import sys

    code = "import sys, kforge.config; print(any(m.startswith('kforge.platforms') for m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


@pytest.mark.parametrize(("text", "expect"), [
    ("agents: {expert: {kind: expert}}\nsuites: {s: {path: p}}\nrun: {agents: [expert], platforms: [gpu9000], "
     "suites: [s]}\n", "'run.platforms[0]': unknown platform 'gpu9000'; the platforms are cpu, triton, cuda, metal"),
    ("agents: [unclosed\n", "not valid YAML: expected ',' or ']'"),
])
def test_kforge_config_says_what_is_wrong_in_one_line(tmp_path: Path, text: str, expect: str) -> None:
    import subprocess
    import sys

    path = tmp_path / "kforge.yaml"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "kforge.cli", "config", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"kforge config: {path}: "), proc.stderr
    assert expect in proc.stderr
