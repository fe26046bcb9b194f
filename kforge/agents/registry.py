"""Build the agent named in the config: the embedded ``expert`` or an LLM through litellm."""

from __future__ import annotations

from kforge.agents.base import Agent
from kforge.config import AgentConfig
from kforge.store import Store


def make_agent(name: str, config: AgentConfig, store: Store) -> Agent:
    """Heavy modules (torch for the expert, litellm for LLM agents) load only here."""
    if config.kind == "expert":
        from kforge.agents.expert import ExpertAgent

        return ExpertAgent(config)
    from kforge.agents.llm_agent import LLMAgent

    return LLMAgent(name, config, store)
