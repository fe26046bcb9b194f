"""The embedded ``expert`` agent: deterministic, rule-based generation and analysis.

``graph`` (the IR) -> ``plans`` (knobs) -> ``cpu_codegen`` (candidate source); ``analysis``
reads profiles and recommends actions that ``plans`` applies in the next round.
"""

from __future__ import annotations
