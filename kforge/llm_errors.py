"""The typed failures of :func:`kforge.llm.complete`: each says what to do next.

    LLMError
    ├── LLMConfigError (fix the configuration; never retried)
    │   ├── LLMAuthError (401/403, or the key variable is unset)
    │   ├── LLMNotFoundError (404: model or api_base wrong)
    │   └── LLMBadRequestError (400)
    ├── LLMContextWindowError (the prompt does not fit)
    ├── LLMUnavailableError (408/429/5xx/connection errors outlasted every retry)
    │   └── LLMTimeoutError
    ├── LLMResponseError (200 without message content)
    └── LLMBudgetError (the agent's budget_usd is spent: no new calls)
"""

from __future__ import annotations


class LLMError(Exception):
    """Base of every failure of :func:`complete`; the message names the model and api_base."""

    def __init__(self, message: str, *, model: str, api_base: str | None) -> None:
        super().__init__(message)
        self.model = model
        self.api_base = api_base


class LLMConfigError(LLMError):
    """The model, its api_base or its key is wrong. Fix the configuration; do not retry."""


class LLMAuthError(LLMConfigError):
    pass


class LLMNotFoundError(LLMConfigError):
    pass


class LLMBadRequestError(LLMConfigError):
    pass


class LLMContextWindowError(LLMError):
    """The prompt is longer than the model's context window."""


class LLMUnavailableError(LLMError):
    """Rate limits, server errors or connection failures outlasted every retry."""


class LLMTimeoutError(LLMUnavailableError):
    pass


class LLMResponseError(LLMError):
    """The server answered 200 but the answer holds no message content."""


class LLMBudgetError(LLMError):
    """The agent's spend cap (``budget_usd``) is reached, or cannot be kept (unknown price):
    no new call is made. Raise the cap and rerun; paid calls are cached."""
