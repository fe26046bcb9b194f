"""litellm itself, imported on first use (a leaf: :mod:`kforge.llm_request` asks it for a
model's capabilities, :mod:`kforge.llm_transport` sends calls through it).

litellm costs ~4-8 s and 200 MB to import: never at a module's top.
"""

from __future__ import annotations

import os
from typing import Any


def import_litellm() -> Any:
    """litellm, imported on first use with the offline price table (never at module top)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    litellm.telemetry = False
    return litellm


def litellm_version() -> str:
    from importlib.metadata import version

    return version("litellm")
