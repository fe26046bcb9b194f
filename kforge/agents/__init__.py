"""Agents: the embedded ``expert`` and LLM agents through litellm, behind one seam."""
