"""The expert compiler's error types (a leaf: every pass raises them, none imports another).

    UnsupportedError            the problem is outside what the compiler expresses; the agent
                                answers ``unsupported: <construct>`` (no candidate)
      NondeterministicReference the reference draws random numbers: no kernel can match it
    NotFusable                  (planner-internal) a value was needed at an index the kernel
                                does not hold: the planner stores it and records the refusal
    PlanError                   knobs a backend or the precision policy does not allow: the
                                agent goes back to the backend's defaults and says why
"""

from __future__ import annotations


class UnsupportedError(ValueError):
    """The problem is outside what the expert can express; ``str(err)`` starts with
    ``"unsupported: "`` and names the offending construct."""

    def __init__(self, what: str) -> None:
        super().__init__(what if what.startswith("unsupported: ") else f"unsupported: {what}")


class NondeterministicReference(UnsupportedError):
    """The reference draws random numbers; ``str(err)`` starts with ``nondeterministic_reference``."""

    def __init__(self, what: str) -> None:
        ValueError.__init__(self, f"nondeterministic_reference: {what}")


class NotFusable(Exception):
    """A claimed node was needed at an index the kernel does not hold."""


class PlanError(ValueError):
    """Knobs the kernel or the precision policy does not allow."""
