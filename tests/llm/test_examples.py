"""The example configs in examples/ are valid and say what docs/LLM.md says they do."""

from __future__ import annotations

from kforge.config import load_config
from kforge.llm import api_base_kind
from tests.pipeline_helpers import REPO


def test_hosted_example_reads_its_key_from_the_environment() -> None:
    config = load_config(REPO / "examples" / "config-hosted.yaml")
    llm = [a for a in config.agents.values() if a.kind == "litellm"]
    assert llm and all(a.api_key_env and a.api_base is None for a in llm)


def test_local_example_points_at_a_local_server_for_free() -> None:
    config = load_config(REPO / "examples" / "config-local.yaml")
    (agent,) = config.agents.values()
    assert agent.kind == "litellm" and api_base_kind(agent.api_base) == "local"
    assert agent.input_cost_per_token == 0.0 and agent.output_cost_per_token == 0.0
